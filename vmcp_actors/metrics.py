"""Prometheus metrics without a lock on the call path.

Each thread records into its own accumulator (a dict it alone writes), so recording a
client request or a backend exchange takes no lock and sends no message; a scrape adds
the accumulators up (``dict.copy`` is atomic under the GIL). Counts only grow, so a scrape
that races a write is at most one observation behind.

Several gunicorn workers: each worker writes its totals to ``$VMCP_METRICS_DIR/<pid>.json``
every ``FLUSH_EVERY`` seconds and on exit, and a scrape of any worker adds its own live
totals to the other workers' files (those of workers gone stay: counters must not go
back). `vmcp-actors serve` makes that directory when it runs several workers. Gauges (sessions,
users, threads, circuits, health) are of the process scraped, labelled with its pid.

Labels are bounded: MCP methods outside the specification count as ``other``, and
backends and composite tools are the configured ones.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.core import Metric

METRICS_DIR_ENV = "VMCP_METRICS_DIR"
FLUSH_EVERY = 2.0
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# family -> (its counter, its histogram, help, label names): a count by labels and the
# durations of the same observations.
FAMILIES: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "requests": ("vmcp_requests", "vmcp_request_duration_seconds",
                 "Client requests by MCP method and outcome.", ("method", "outcome")),
    "backend": ("vmcp_backend_requests", "vmcp_backend_request_duration_seconds",
                "HTTP exchanges with backends by outcome (duration: to the response's headers).",
                ("backend", "outcome")),
    "discovery": ("vmcp_discoveries", "vmcp_discovery_duration_seconds",
                  "Backend discoveries (handshake and lists) by outcome.", ("backend", "outcome")),
    "workflow": ("vmcp_workflow_runs", "vmcp_workflow_duration_seconds",
                 "Composite tool runs by final state.", ("composite", "state")),
    "script": ("vmcp_scripts", "vmcp_script_duration_seconds",
               "Code mode scripts (execute_tool_script) by outcome: ok, tool_error (the script failed or hit a "
               "limit), cancelled, error.", ("outcome",)),
    "script_call": ("vmcp_script_tool_calls", "vmcp_script_tool_call_duration_seconds",
                    "Tool calls made by code mode scripts, by outcome (ok, tool_error, error).", ("outcome",)),
    "oauth": ("vmcp_oauth_events", "vmcp_oauth_event_duration_seconds",
              "Authorization server events (sign-ins, consents, tokens, registrations, refusals) by outcome.",
              ("event", "outcome")),
    "connection": ("vmcp_connection_events", "vmcp_connection_event_duration_seconds",
                   "People's connections to backends of type oauth (links, connects, refreshes, refusals) by "
                   "outcome.", ("event", "outcome")),
}
MCP_METHODS = frozenset({
    "initialize", "ping", "tools/list", "tools/call", "resources/list", "resources/templates/list",
    "resources/read", "resources/subscribe", "resources/unsubscribe", "prompts/list", "prompts/get",
    "completion/complete", "logging/setLevel", "server/discover", "subscriptions/listen",
    "notifications/initialized", "notifications/cancelled", "notifications/roots/list_changed",
    "notifications/progress", "response", "GET", "DELETE",
})


def method_label(method: str | None) -> str:
    return method if method in MCP_METHODS else "other"


class Recorder:
    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()  # only when a thread records for the first time
        # One dict per thread, written by that thread only: (family, labels) -> [count, sum, buckets...].
        self._accumulators: list[dict[tuple[str, tuple[str, ...]], list[float]]] = []

    def observe(self, family: str, labels: tuple[str, ...], seconds: float) -> None:
        accumulator = getattr(self._local, "accumulator", None)
        if accumulator is None:
            accumulator = self._local.accumulator = {}
            with self._lock:
                self._accumulators.append(accumulator)
        key = (family, labels)
        row = accumulator.get(key)
        if row is None:
            row = accumulator[key] = [0, 0.0] + [0] * len(BUCKETS)
        row[0] += 1
        row[1] += seconds
        for index, bound in enumerate(BUCKETS):
            if seconds <= bound:
                row[2 + index] += 1
                break

    def totals(self) -> dict[tuple[str, tuple[str, ...]], list[float]]:
        """Every thread's rows added up (buckets not yet cumulative)."""
        with self._lock:
            accumulators = list(self._accumulators)
        summed: dict[tuple[str, tuple[str, ...]], list[float]] = {}
        for accumulator in accumulators:
            for key, row in accumulator.copy().items():
                _add(summed, key, list(row))
        return summed


def _add(into: dict, key: Any, row: list[float]) -> None:
    current = into.get(key)
    if current is None:
        into[key] = row
    else:
        for index, value in enumerate(row):
            current[index] += value


METRICS = Recorder()


def record_request(method: str | None, status: int, seconds: float) -> None:
    outcome = "ok" if status < 400 else ("client_error" if status < 500 else "server_error")
    METRICS.observe("requests", (method_label(method), outcome), seconds)


def record_backend(backend: str, outcome: str, seconds: float) -> None:
    METRICS.observe("backend", (backend, outcome), seconds)


def record_oauth(event: str, outcome: str) -> None:
    METRICS.observe("oauth", (event, outcome), 0.0)


def record_connection(event: str, outcome: str) -> None:
    METRICS.observe("connection", (event, outcome), 0.0)


# -- several workers ----------------------------------------------------------------------


class ProcessTotals:
    """This worker's totals, written for the other workers' scrapes."""

    def __init__(self, directory: str | None, recorder: Recorder = METRICS):
        self._directory = Path(directory) if directory else None
        self._recorder = recorder
        self._stop = threading.Event()  # set once at stop: the writer thread leaves
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._directory is None:
            return
        self._thread = threading.Thread(target=self._run, name="vmcp-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.flush()

    def flush(self) -> None:
        if self._directory is None:
            return
        rows = [[family, list(labels), row] for (family, labels), row in self._recorder.totals().items()]
        target = self._directory / f"{os.getpid()}.json"
        partial = target.with_suffix(".tmp")
        try:
            partial.write_text(json.dumps(rows))
            partial.replace(target)  # a reader sees the old file or the new one, never half
        except OSError:
            pass  # the next flush tries again

    def others(self) -> dict[tuple[str, tuple[str, ...]], list[float]]:
        summed: dict[tuple[str, tuple[str, ...]], list[float]] = {}
        if self._directory is None:
            return summed
        own = f"{os.getpid()}.json"
        for path in self._directory.glob("*.json"):
            if path.name == own:
                continue
            try:
                rows = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            for family, labels, row in rows:
                _add(summed, (family, tuple(labels)), list(row))
        return summed

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_EVERY):
            self.flush()


# -- exposition ---------------------------------------------------------------------------

Gauges = Callable[[], Iterable[tuple[str, str, Mapping[tuple[str, ...], float], tuple[str, ...]]]]


class GatewayCollector:
    """What a scrape returns: the histograms (this worker's live totals plus the other
    workers' files) and the gauges ``gauges()`` reads from this process."""

    def __init__(self, totals: ProcessTotals, gauges: Gauges, recorder: Recorder = METRICS):
        self._totals = totals
        self._gauges = gauges
        self._recorder = recorder

    def collect(self) -> Iterator[Metric]:
        # Imported at the first scrape: a process nobody scrapes never loads it.
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        summed = self._recorder.totals()
        for key, row in self._totals.others().items():
            _add(summed, key, row)
        for family, (counter_name, histogram_name, help_text, label_names) in FAMILIES.items():
            rows = sorted((labels, row) for (name, labels), row in summed.items() if name == family)
            counter = CounterMetricFamily(counter_name, help_text, labels=label_names)
            histogram = HistogramMetricFamily(histogram_name, help_text, labels=label_names)
            for labels, row in rows:
                counter.add_metric(list(labels), row[0])
                cumulative, buckets = 0, []
                for bound, count in zip(BUCKETS, row[2:]):
                    cumulative += count
                    buckets.append((repr(bound), cumulative))
                buckets.append(("+Inf", row[0]))
                histogram.add_metric(list(labels), buckets, row[1])
            yield counter
            yield histogram
        pid = str(os.getpid())
        for name, help_text, values, label_names in self._gauges():
            gauge = GaugeMetricFamily(name, help_text, labels=[*label_names, "pid"])
            for labels, value in sorted(values.items()):
                gauge.add_metric([*labels, pid], value)
            yield gauge


def exposition(collector: GatewayCollector) -> tuple[bytes, str]:
    """The scrape's body and its content type."""
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
    from prometheus_client.registry import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST

