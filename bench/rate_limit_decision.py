"""What one rate-limit decision costs, alone: ``RateLimiter.admit`` for a user's call of a
tool that passes four buckets (global, perUser, the tool's global and perUser), with the
buckets in memory and in a local redis-server, beside a Redis ``PING`` on the same client
(the least one round trip costs). Interleaved in rounds; wall time and this process's CPU
per decision. The whole call's cost, through a real gateway in both revisions, is
``bench.compare --after-config bench/rate_limits.yaml`` (docs/benchmarks.md, issue 25).

Targets: a decision in memory costs under 50 us; in Redis it is one round trip, so its
wall time is at most 3 x a PING's.

    .venv/bin/python -m bench.rate_limit_decision [--decisions 5000]
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bench._common import Check, parse_args, print_header, record, run_benchmark, table

ROUNDS = 4
PER_BUCKET = {"maxTokens": 10_000_000, "refillPeriod": 8760 * 3600.0}  # refills 0.3 tokens a second
TARGET_MEMORY_US = 50.0
TARGET_REDIS_PINGS = 3.0


def body(decisions: int) -> list[Check]:
    import redis

    from tests.redis_server import RedisServer
    from vmcp_actors.config import RateLimitingConfig, TokenBucket, ToolRateLimit
    from vmcp_actors.identity import Identity
    from vmcp_actors.limits import MemoryBuckets, RateLimiter, RedisBuckets

    print_header("rate_limit_decision: one decision over four buckets, memory vs Redis", "none (no gateway)", [
        f"{decisions} decisions per mode per round, {ROUNDS} rounds, modes interleaved (order reversed every round)",
        "Redis: a local redis-server (tests/redis_server.py), redis-py's client, one script run per decision",
    ])
    bucket = TokenBucket(PER_BUCKET["maxTokens"], PER_BUCKET["refillPeriod"])
    limits = RateLimitingConfig(shared=bucket, per_user=bucket,
                                tools=(ToolRateLimit("echo_echo", shared=bucket, per_user=bucket),))
    alice = Identity("https://idp.example", "alice")
    server = RedisServer().start()
    try:
        client = redis.Redis(port=server.port)
        in_memory = RateLimiter(limits, MemoryBuckets())
        in_redis = RateLimiter(limits, RedisBuckets(client), "bench:")
        modes: dict[str, Callable[[], object]] = {
            "memory: admit": lambda: in_memory.admit(alice, "echo_echo"),
            "redis: admit": lambda: in_redis.admit(alice, "echo_echo"),
            "redis: PING": client.ping,
        }
        wall = dict.fromkeys(modes, 0.0)
        cpu = dict.fromkeys(modes, 0.0)
        for run in modes.values():  # warm: the script is loaded, the connection open
            run()
        for round_no in range(ROUNDS):
            for name in (list(modes) if round_no % 2 == 0 else list(modes)[::-1]):
                run = modes[name]
                cpu_start, started = time.process_time(), time.perf_counter()
                for _ in range(decisions):
                    run()
                wall[name] += time.perf_counter() - started
                cpu[name] += time.process_time() - cpu_start
        spent = PER_BUCKET["maxTokens"] - (in_redis.level(in_redis.buckets_for(alice, "echo_echo")[0]) or 0)
    finally:
        server.stop()
    total = decisions * ROUNDS
    per = {name: wall[name] / total * 1e6 for name in modes}
    cpu_per = {name: cpu[name] / total * 1e6 for name in modes}
    print(table(["mode", "wall per decision", "client CPU per decision", "/ PING (wall)"], [
        (name, f"{per[name]:.0f} us", f"{cpu_per[name]:.0f} us", f"{per[name] / per['redis: PING']:.2f}")
        for name in modes]))
    for name in modes:
        record(f"{name}: us per decision", round(per[name], 1))
    pings = per["redis: admit"] / per["redis: PING"]
    return [
        Check("memory: a decision over four buckets", f"{per['memory: admit']:.1f} us", f"< {TARGET_MEMORY_US:g} us",
              per["memory: admit"] < TARGET_MEMORY_US),
        Check("redis: a decision, in PINGs (one round trip)", f"{pings:.2f}", f"<= {TARGET_REDIS_PINGS:g}",
              pings <= TARGET_REDIS_PINGS),
        Check("redis: every decision spent a token of the global bucket", f"{spent:.0f}", f">= 0.99 x {total}",
              spent >= 0.99 * total),
    ]


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--decisions", type=int, default=5000, help="decisions per mode per round")

    args = parse_args(__doc__.splitlines()[0], extra=extra)
    run_benchmark(lambda: body(args.decisions))


if __name__ == "__main__":
    main()
