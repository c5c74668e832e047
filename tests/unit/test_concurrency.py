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


# -- the timer queue ---------------------------------------------------------------------


def test_timers_fire_in_deadline_order_on_one_thread():
    from vmcp_actors.concurrency import TimerQueue

    timers = TimerQueue(name="test-timers")
    fired: list[tuple[str, str]] = []
    done = threading.Event()
    for name, delay in (("late", 0.06), ("early", 0.01), ("middle", 0.03)):
        timers.call_later(delay, lambda name=name: fired.append((name, threading.current_thread().name)))
    timers.call_later(0.08, done.set)
    assert done.wait(2)
    assert [name for name, _ in fired] == ["early", "middle", "late"]
    assert {thread for _, thread in fired} == {"test-timers"}


def test_a_cancelled_timer_never_fires_and_a_failing_one_does_not_stop_the_others():
    from vmcp_actors.concurrency import TimerQueue

    timers = TimerQueue()
    fired: list[str] = []
    done = threading.Event()
    cancelled = timers.call_later(0.01, lambda: fired.append("cancelled"))
    timers.call_later(0.02, lambda: 1 / 0)
    timers.call_later(0.03, lambda: fired.append("after the failure"))
    timers.call_later(0.04, done.set)
    cancelled.cancel()
    assert done.wait(2)
    assert fired == ["after the failure"]
    assert timers.pending() == 0


def test_an_earlier_timer_scheduled_later_wakes_the_thread():
    from vmcp_actors.concurrency import TimerQueue

    timers = TimerQueue()
    far = threading.Event()
    near = threading.Event()
    timers.call_later(60, far.set)
    timers.call_later(0.01, near.set)
    assert near.wait(2) and not far.is_set()
    assert timers.pending() == 1
