"""What creating a composite task costs when its owner already has many ended ones: the
per-user cap (``operational.tasks.maxLivePerUser``) counts the owner's live tasks, and
ended tasks are kept for ``resultTTL``. ``CompositeTasks.begin`` (the cap check and the
record's first write) for an owner with no earlier tasks and for one with ``--ended``
ended tasks, in memory and in a local redis-server, interleaved in rounds.

Target: with ``--ended`` ended tasks, creation costs at most 1.5 x what it costs with none,
in either store (the cap reads live tasks only).

    .venv/bin/python -m bench.task_creation [--ended 1000] [--creations 300]

It imports ``vmcp_actors`` in this process: for another commit's code, run it with
``PYTHONPATH`` set to that commit's tree (docs/benchmarks.md).
"""

from __future__ import annotations

import secrets
import time

from bench._common import Check, parse_args, print_header, record, run_benchmark, table

ROUNDS = 4
TARGET_RATIO = 1.5


def body(ended: int, creations: int) -> list[Check]:
    import vmcp_actors
    from tests.redis_server import RedisServer
    from tests.unit.test_task_records import Signals
    from vmcp_actors.config import TasksConfig
    from vmcp_actors.decorators._composite_tasks import CompositeTasks
    from vmcp_actors.signing import Signer
    from vmcp_actors.users._redis_store import RedisRecordStore
    from vmcp_actors.users._store import MemoryRecordStore

    print_header("task_creation: a composite task's creation, its owner with no ended tasks vs many",
                 "none (no gateway)", [
                     f"vmcp_actors from {vmcp_actors.__file__}",
                     f"owners: one with no tasks, one with {ended} ended tasks (kept for resultTTL); "
                     f"{creations} creations per owner per round, {ROUNDS} rounds, each created task ended at once",
                 ])
    server = RedisServer().start()
    try:
        stores = {"memory": MemoryRecordStore(),
                  "redis": RedisRecordStore.connect(server.address, 0, None, Signer(secrets.token_bytes(32)),
                                                    key_prefix="bench:", session_ttl=60)}
        per: dict[str, float] = {}
        for name, store in stores.items():
            tasks = CompositeTasks(store, Signals(), TasksConfig(max_live_per_user=10_000, max_live_per_worker=20_000))

            def create(owner: str, tasks=tasks, store=store) -> None:
                run = tasks.begin(owner, owner, "careful_echo", 60.0, None, lambda: lambda: None)
                store.update_task(run.record.task_id, lambda current: current.ended("completed", "completed",
                                                                                     time.time(), result={}))
                tasks._forget(run)

            for _ in range(ended):
                create("busy-owner")
            spent = {"new-owner": 0.0, "busy-owner": 0.0}
            for round_no in range(ROUNDS):
                for owner in (list(spent) if round_no % 2 == 0 else list(spent)[::-1]):
                    started = time.perf_counter()
                    for _ in range(creations):
                        create(owner if owner == "busy-owner" else f"new-owner-{secrets.token_hex(4)}")
                    spent[owner] += time.perf_counter() - started
            for owner, seconds in spent.items():
                per[f"{name}: {owner}"] = seconds / (creations * ROUNDS) * 1000
    finally:
        server.stop()
    print(table(["store: owner", "ms per creation"], [(label, f"{ms:.3f}") for label, ms in per.items()]))
    checks = []
    for name in ("memory", "redis"):
        ratio = per[f"{name}: busy-owner"] / per[f"{name}: new-owner"]
        record(f"{name}: busy / new owner", round(ratio, 2))
        checks.append(Check(f"{name}: creation with {ended} ended tasks / with none", f"{ratio:.2f}",
                            f"<= {TARGET_RATIO:g}", ratio <= TARGET_RATIO))
    return checks


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--ended", type=int, default=1000, help="the busy owner's ended tasks")
        parser.add_argument("--creations", type=int, default=300, help="creations per owner per round")

    args = parse_args(__doc__.splitlines()[0], extra=extra)
    run_benchmark(lambda: body(args.ended, args.creations))


if __name__ == "__main__":
    main()
