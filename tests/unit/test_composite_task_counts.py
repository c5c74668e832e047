"""CompositeTasks' count of ended runs (what vmcp_composite_tasks_ended shows): by the
status the task's record ends with, which another worker's tasks/cancel may have set."""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any

import pykka

from vmcp_actors.config import TasksConfig
from vmcp_actors.core._task_records import CANCELLED
from vmcp_actors.decorators import CompositeTasks
from vmcp_actors.users._store import MemoryRecordStore
from vmcp_actors.users._task_signals import LocalTaskSignals


def started_run(tasks: CompositeTasks) -> tuple[Any, cf.Future[dict[str, Any]]]:
    """(the run, the outcome that ends it)."""
    run = tasks.begin("owner-digest", "alice", "careful_echo", 30.0, None, lambda: lambda: None)
    outcome: cf.Future[dict[str, Any]] = cf.Future()
    tasks.start(run, outcome, lambda: None)  # a run whose outcome the test sets
    return run, outcome


def test_ended_runs_are_counted_by_the_status_their_records_end_with():
    store = MemoryRecordStore()
    tasks = CompositeTasks(store, LocalTaskSignals(), TasksConfig())
    try:
        finished, finishing = started_run(tasks)
        overtaken, overtaken_outcome = started_run(tasks)
        assert tasks.ended_counts() == {} and tasks.live_count() == 2

        finishing.set_result({"content": [{"type": "text", "text": "hi"}]})
        # Another worker's tasks/cancel wrote the record before this run's own end came.
        store.update_task(overtaken.record.task_id, lambda record: record.ended(CANCELLED, "cancelled by the client",
                                                                                record.updated))
        overtaken_outcome.set_result({"content": []})
        # Each end is recorded on the I/O pool, then counted.
        assert (finished.ended.result(timeout=5), overtaken.ended.result(timeout=5)) == ("completed", "cancelled")

        assert tasks.ended_counts() == {("careful_echo", "completed"): 1, ("careful_echo", "cancelled"): 1}
        assert tasks.running() == [] and store.task(finished.record.task_id).status == "completed"
    finally:
        pykka.ActorRegistry.stop_all()
