import threading
import time

from vmcp_actors.concurrency import ElasticPool


def test_a_steady_load_reuses_workers():
    pool = ElasticPool()
    for _ in range(50):
        pool.submit(lambda: None).result(timeout=5)
    assert pool.workers == 1


def test_a_new_worker_starts_only_when_none_is_idle():
    pool = ElasticPool()
    release = threading.Event()
    busy = [pool.submit(release.wait, 5) for _ in range(4)]
    assert pool.workers == 4
    release.set()
    for future in busy:
        assert future.result(timeout=5) is True
    time.sleep(0.05)
    pool.submit(lambda: None).result(timeout=5)
    assert pool.workers == 4  # reused an idle one


def test_a_job_waiting_for_another_job_never_starves_it():
    pool = ElasticPool()
    inner_started = threading.Event()

    def outer():
        inner = pool.submit(lambda: inner_started.set() or "inner done")
        return inner.result(timeout=5)

    outers = [pool.submit(outer) for _ in range(20)]
    assert [f.result(timeout=10) for f in outers] == ["inner done"] * 20


def test_exceptions_land_in_the_future_and_the_worker_survives():
    pool = ElasticPool()
    failing = pool.submit(lambda: 1 / 0)
    assert isinstance(failing.exception(timeout=5), ZeroDivisionError)
    assert pool.submit(lambda: "still serving").result(timeout=5) == "still serving"
    assert pool.workers == 1


def test_idle_workers_leave():
    pool = ElasticPool(idle_exit=0.05)
    release = threading.Event()
    busy = [pool.submit(release.wait, 5) for _ in range(3)]
    release.set()
    for future in busy:
        future.result(timeout=5)
    deadline = time.monotonic() + 3
    while pool.workers > 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.workers == 0
    assert pool.submit(lambda: "back").result(timeout=5) == "back"
