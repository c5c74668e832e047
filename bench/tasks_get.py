"""Not in run_all: ``tasks/get`` of a 2026-07-28 task through
two gateway workers that share a signing key (issue 24).

A task's handle is sealed with the signing key (deterministic AES-GCM-SIV), so opening it
needs no lookup: any worker holding the key serves ``tasks/get`` for a handle another worker
issued. This measures that it costs the same on either worker.

* One task backend (tests/task_backends.py, 2026-07-28 with the tasks extension), in this
  process (the hand-written server has no separate-process launcher).
* Two gateways (``vmcp-actors serve``, one gunicorn worker each, two processes) with the
  same config: ``operational.signingKeyEnv`` naming one random key, in-memory records (a
  2026-07-28 request has no session, so nothing else is shared).
* N tasks (``run_until_cancelled``: they stay ``working``) created through worker A.
* Then ``tasks/get`` of the same handles via A and via B, plus for comparison ``tasks/get``
  directly at the backend with its own task ids, and a plain ``tools/call`` of ``greet``
  through A. Rounds take the modes in order, then reversed (A B direct greet, greet direct
  B A, ...), so A and B are interleaved A,B,B,A and machine noise lands on all alike.
  Sequential: one client (one keep-alive connection per mode), calls cycling over the
  handles: p50/p90 and calls/s over the rounds' wall time. Concurrent: ``--threads``
  clients per mode, each its own connection: p50/p90 and calls/s.
* Worker B's very first request is a ``tasks/get`` (B has not talked to the backend yet):
  its outcome is reported and is a target (a handle must open on any worker).
* Every answer is checked (the handle, or the backend id, and ``working``); the tasks are
  cancelled through B at the end, and the backend must see them ``cancelled``.

    .venv/bin/python -m bench.tasks_get [--tasks 20] [--calls 400] [--threads 4] [--rounds 4]
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import time
from typing import Any

import requests

from bench._common import (
    Check,
    Stats,
    _answer,
    gateway,
    parse_args,
    percentile,
    print_header,
    raise_failures,
    run_benchmark,
    run_threads,
    settle_heap,
    table,
)

KEY_ENV = "VMCP_BENCH_TASK_SIGNING_KEY"
WARMUP = 20
MODES = ("A", "B", "direct", "greet A")
LABELS = {"A": "tasks/get via worker A (issued the handles)",
          "B": "tasks/get via worker B (same key, never saw them)",
          "direct": "tasks/get directly at the backend (its ids)",
          "greet A": "tools/call greet via worker A"}


class TaskClient:
    """2026-07-28 requests declaring the tasks extension, over one keep-alive connection."""

    def __init__(self, url: str):
        from tests.task_backends import client_capabilities

        self.url = url
        self.http = requests.Session()
        self.ids = itertools.count(1)
        self.capabilities = client_capabilities()

    def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        from tests.task_backends import (
            META_CLIENT_CAPABILITIES,
            META_CLIENT_INFO,
            META_PROTOCOL_VERSION,
            METHOD_HEADER,
            NAME_BEARING,
            NAME_HEADER,
            PROTOCOL_VERSION,
            PROTOCOL_VERSION_HEADER,
        )

        request_id = next(self.ids)
        body = {**params, "_meta": {META_PROTOCOL_VERSION: PROTOCOL_VERSION,
                                    META_CLIENT_INFO: {"name": "vmcp-bench", "version": "1"},
                                    META_CLIENT_CAPABILITIES: self.capabilities}}
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   PROTOCOL_VERSION_HEADER: PROTOCOL_VERSION, METHOD_HEADER: method}
        name = body.get(NAME_BEARING.get(method, ""))
        if isinstance(name, str):
            headers[NAME_HEADER] = name  # handles and the backend's ids are plain ASCII
        data = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": body},
                          separators=(",", ":"))
        response = self.http.post(self.url, data=data, headers=headers, timeout=30)
        answer = _answer(response, request_id)
        if "error" in answer or response.status_code != 200:
            raise RuntimeError(f"{method} at {self.url}: HTTP {response.status_code}: {answer.get('error', answer)}")
        return answer["result"]

    def close(self) -> None:
        self.http.close()


def body(server: str, n_tasks: int, calls: int, threads: int, rounds: int) -> list[Check]:
    from tests.task_backends import task_backend

    per_round = max(1, calls // rounds)
    per_thread = max(1, per_round // threads)
    print_header("tasks/get: a handle issued by worker A, served by worker A and by worker B", server, [
        "backend: tests.task_backends.task_backend('jobs') (2026-07-28, tasks extension), in this process",
        ("gateways: two processes (A, B), one gunicorn worker each, the same config: operational.signingKeyEnv "
         "(one random 32-byte key), memory records"),
        f"tasks: {n_tasks} x run_until_cancelled created through A (they stay working)",
        (f"sequential: 1 client, {per_round * rounds} calls per mode after {WARMUP} warm-up calls, "
         f"{rounds} rounds taking the modes in order, then reversed ({', '.join(MODES)} / reversed)"),
        f"concurrent: {threads} clients per mode, {per_thread * threads * rounds} calls per mode, same rounds",
    ])
    os.environ[KEY_ENV] = secrets.token_hex(16)
    operational = {"signingKeyEnv": KEY_ENV}
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(task_backend("jobs", delay=0.1, job_seconds=0.1))
        gw_a = stack.enter_context(gateway({"jobs": backend.mcp_url}, server=server, operational=operational))
        gw_b = stack.enter_context(gateway({"jobs": backend.mcp_url}, server=server, operational=operational))
        creator = TaskClient(gw_a.url)
        handles = []
        for _ in range(n_tasks):
            created = creator.rpc("tools/call", {"name": "jobs_run_until_cancelled", "arguments": {}})
            if created.get("resultType") != "task" or created.get("status") != "working":
                raise RuntimeError(f"not a working task: {created}")
            handles.append(created["taskId"])
        creator.close()
        backend_ids = list(backend.tasks)
        if len(backend_ids) != n_tasks or set(backend_ids) & set(handles):
            raise RuntimeError(f"the backend holds {len(backend_ids)} tasks (wanted {n_tasks}, none a handle)")

        urls = {"A": gw_a.url, "B": gw_b.url, "direct": backend.mcp_url, "greet A": gw_a.url}
        ids = {"A": handles, "B": handles, "direct": backend_ids, "greet A": handles}

        def one(client: TaskClient, mode: str, i: int) -> None:
            if mode == "greet A":
                result = client.rpc("tools/call", {"name": "jobs_greet", "arguments": {"name": f"n{i}"}})
                if result["content"][0]["text"] != f"Hello, n{i}!":
                    raise RuntimeError(f"greet: {result}")
                return
            task_id = ids[mode][i % n_tasks]
            result = client.rpc("tasks/get", {"taskId": task_id})
            if result.get("taskId") != task_id or result.get("status") != "working":
                raise RuntimeError(f"tasks/get via {mode}: {result}")

        clients = {mode: [TaskClient(urls[mode]) for _ in range(max(threads, 1))] for mode in MODES}
        # B's very first request: B has not talked to the backend yet (no handshake)
        try:
            one(clients["B"][0], "B", 0)
            cold_b = "answered (working)"
        except RuntimeError as exc:
            cold_b = f"FAILED: {str(exc).split(': ', 1)[1][:160]}"
        for mode in MODES:
            for client in clients[mode]:
                for i in range(WARMUP):
                    one(client, mode, i)
        settle_heap()

        order: list[str] = []
        for round_no in range(rounds):
            order.extend(MODES if round_no % 2 == 0 else reversed(MODES))

        seq: dict[str, list[float]] = {m: [] for m in MODES}
        seq_wall = dict.fromkeys(MODES, 0.0)
        conc: dict[str, list[float]] = {m: [] for m in MODES}
        conc_wall = dict.fromkeys(MODES, 0.0)
        for mode in order:
            client = clients[mode][0]
            started_round = time.perf_counter()
            for i in range(per_round):
                started = time.perf_counter()
                one(client, mode, i)
                seq[mode].append(time.perf_counter() - started)
            seq_wall[mode] += time.perf_counter() - started_round

        for mode in order:
            def work(index: int, mode: str = mode) -> list[float]:
                samples = []
                for i in range(per_thread):
                    started = time.perf_counter()
                    one(clients[mode][index], mode, index * per_thread + i)
                    samples.append(time.perf_counter() - started)
                return samples

            started_round = time.perf_counter()
            results = run_threads(threads, work, timeout=60)
            conc_wall[mode] += time.perf_counter() - started_round
            raise_failures(results)
            for samples in results:
                conc[mode].extend(samples)

        # cancel through B: the other worker opens A's handles for tasks/cancel too
        canceller = TaskClient(gw_b.url)
        for handle in handles:
            canceller.rpc("tasks/cancel", {"taskId": handle})
        canceller.close()
        for task_id in backend_ids:
            backend.wait_for_status(task_id, "cancelled", timeout=10)
        for mode in MODES:
            for client in clients[mode]:
                client.close()

    def rows(samples: dict[str, list[float]], wall: dict[str, float]) -> tuple[list[tuple], dict[str, float]]:
        p50 = {m: percentile([s * 1000 for s in samples[m]], 50) for m in MODES}
        p90 = {m: percentile([s * 1000 for s in samples[m]], 90) for m in MODES}
        rate = {m: len(samples[m]) / wall[m] for m in MODES}
        out = [(LABELS[m], len(samples[m]), f"{p50[m]:.2f} ms", f"{p90[m]:.2f} ms",
                f"{Stats.of(samples[m]).max:.1f} ms", f"{rate[m]:.0f}/s") for m in MODES]
        out.append(("ratio B / A", "", f"{p50['B'] / p50['A']:.2f}", f"{p90['B'] / p90['A']:.2f}", "",
                    f"{rate['B'] / rate['A']:.2f}"))
        out.append(("ratio A / direct", "", f"{p50['A'] / p50['direct']:.2f}", f"{p90['A'] / p90['direct']:.2f}",
                    "", f"{rate['A'] / rate['direct']:.2f}"))
        out.append(("ratio A tasks/get / A greet", "", f"{p50['A'] / p50['greet A']:.2f}",
                    f"{p90['A'] / p90['greet A']:.2f}", "", f"{rate['A'] / rate['greet A']:.2f}"))
        return out, {"p50": p50["B"] / p50["A"], "rate": rate["B"] / rate["A"]}

    headers = ["mode", "calls", "p50", "p90", "max", "throughput"]
    seq_rows, seq_ratio = rows(seq, seq_wall)
    conc_rows, _ = rows(conc, conc_wall)
    print(f"sequential (1 client, calls cycling over the {n_tasks} tasks)")
    print(table(headers, seq_rows))
    print()
    print(f"concurrent ({threads} clients per mode)")
    print(table(headers, conc_rows))
    print()
    print(f"worker B's first tasks/get (before B had talked to the backend): {cold_b}")
    print(f"all {n_tasks} tasks cancelled through worker B; the backend saw each one cancelled")
    return [
        Check("a cold worker B's first tasks/get", cold_b.split(", 'message'")[0][:48], "answered", not cold_b.startswith("FAILED")),
        Check("every answer checked, tasks cancelled through B", "yes", "yes", True),
        Check("sequential p50 B / A", f"{seq_ratio['p50']:.2f}", "<= 1.25 (no lookup on B)",
              seq_ratio["p50"] <= 1.25),
    ]


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--tasks", type=int, default=20, help="tasks created through worker A")
        parser.add_argument("--calls", type=int, default=400, help="sequential calls per mode (all rounds)")
        parser.add_argument("--threads", type=int, default=4, help="clients per mode in the concurrent phase")
        parser.add_argument("--rounds", type=int, default=4)

    args = parse_args(__doc__.splitlines()[0], extra=extra)
    run_benchmark(lambda: body(args.server, args.tasks, args.calls, args.threads, args.rounds))


if __name__ == "__main__":
    main()
