import concurrent.futures as cf
import threading
import time

from tests.gateway import wait_until
from vmcp_actors.concurrency import (
    BoundedPool,
    Deadline,
    on_settled,
    settle_from,
    when_all,
)

WAIT = 30.0  # for what takes milliseconds: generous, so a loaded machine does not fail a test


def all_idle(pool: BoundedPool) -> bool:
    """Wait until every worker of ``pool`` is back waiting for a job (a worker hands over a
    job's result before it goes back to waiting)."""
    return wait_until(lambda: pool.wait_idle(0), timeout=WAIT, interval=0.001)


def test_a_steady_load_reuses_workers():
    pool = BoundedPool()
    for _ in range(50):
        pool.submit(lambda: None).result(timeout=WAIT)
        assert all_idle(pool)
    assert pool.workers == 1


def test_a_new_worker_starts_only_when_none_is_idle():
    pool = BoundedPool()
    release = threading.Event()
    busy = [pool.submit(release.wait, WAIT) for _ in range(4)]
    assert pool.workers == 4
    release.set()
    for future in busy:
        assert future.result(timeout=WAIT) is True
    assert all_idle(pool)
    pool.submit(lambda: None).result(timeout=WAIT)
    assert pool.workers == 4  # reused an idle one


def test_the_pool_never_runs_more_than_its_bound_and_queues_the_rest():
    pool = BoundedPool(max_workers=3)
    release = threading.Event()
    lock = threading.Lock()
    running = [0, 0]  # now, most at once

    def job():
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        release.wait(WAIT)
        with lock:
            running[0] -= 1
        return "done"

    jobs = [pool.submit(job) for _ in range(10)]
    assert wait_until(lambda: running[0] == 3, timeout=WAIT)  # the workers hold their jobs
    assert pool.workers == 3 and pool.queued == 7
    release.set()
    assert [f.result(timeout=WAIT) for f in jobs] == ["done"] * 10
    assert running[1] == 3


def test_chained_work_never_waits_in_the_pool():
    """Work that depends on other work is chained by callbacks, so a pool of one worker
    runs a hundred two-step chains without any job waiting for another."""
    pool = BoundedPool(max_workers=1)
    chains = []
    for index in range(100):
        chain = cf.Future()
        first = pool.submit(lambda index=index: index)
        on_settled(first, lambda done, chain=chain: on_settled(
            pool.submit(lambda: done.result() * 2), lambda second: settle_from(chain, second)))
        chains.append(chain)
    assert [chain.result(timeout=WAIT) for chain in chains] == [index * 2 for index in range(100)]


def test_when_all_settles_once_every_future_has():
    futures = {name: cf.Future() for name in "abc"}
    joined = when_all(futures)
    futures["a"].set_result(1)
    futures["b"].set_exception(ValueError("b"))
    assert not joined.done()
    futures["c"].set_result(3)
    assert joined.result(timeout=1) == futures
    assert when_all({}).result(timeout=1) == {}


def test_a_deadline_caps_waits_and_moves_earlier():
    before = time.monotonic()
    deadline = Deadline.after(10)
    assert before + 10 <= deadline.at <= time.monotonic() + 10
    assert 0 < deadline.remaining() <= 10 and deadline.cap(2) == 2
    assert deadline.earlier(1).at == deadline.at - 1 and deadline.earlier(1).remaining() <= 9
    assert Deadline.after(-1).remaining() == 0 and Deadline.after(-1).expired


def test_exceptions_land_in_the_future_and_the_worker_survives():
    pool = BoundedPool()
    failing = pool.submit(lambda: 1 / 0)
    assert isinstance(failing.exception(timeout=WAIT), ZeroDivisionError)
    assert all_idle(pool)  # the worker that ran it is waiting for the next job
    assert pool.submit(lambda: "still serving").result(timeout=WAIT) == "still serving"
    assert pool.workers == 1


def test_idle_workers_leave():
    pool = BoundedPool(idle_exit=0.05)  # the idle period under test
    release = threading.Event()
    busy = [pool.submit(release.wait, WAIT) for _ in range(3)]
    release.set()
    for future in busy:
        future.result(timeout=WAIT)
    assert wait_until(lambda: pool.workers == 0, timeout=WAIT)
    assert pool.submit(lambda: "back").result(timeout=WAIT) == "back"


# -- the timer queue ---------------------------------------------------------------------


def hold_timer_thread(timers) -> threading.Event:
    """Holds ``timers``' thread in a callback until the returned event is set, so timers
    scheduled meanwhile all wait, however slowly the test schedules them."""
    entered, release = threading.Event(), threading.Event()
    timers.call_later(0, lambda: (entered.set(), release.wait(WAIT)))
    assert entered.wait(WAIT)
    return release


def test_timers_fire_in_deadline_order_on_one_thread():
    from vmcp_actors.concurrency import TimerQueue

    timers = TimerQueue(name="test-timers")
    fired: list[tuple[str, str]] = []
    done = threading.Event()
    release = hold_timer_thread(timers)
    for name, delay in (("late", 0.06), ("early", 0.01), ("middle", 0.03)):
        timers.call_later(delay, lambda name=name: fired.append((name, threading.current_thread().name)))
    timers.call_later(0.08, done.set)
    release.set()
    assert done.wait(WAIT)
    assert [name for name, _ in fired] == ["early", "middle", "late"]
    assert {thread for _, thread in fired} == {"test-timers"}


def test_a_cancelled_timer_never_fires_and_a_failing_one_does_not_stop_the_others():
    from vmcp_actors.concurrency import TimerQueue

    timers = TimerQueue()
    fired: list[str] = []
    done = threading.Event()
    release = hold_timer_thread(timers)  # so the cancel comes before the timer is due, however slow the test
    cancelled = timers.call_later(0.01, lambda: fired.append("cancelled"))
    timers.call_later(0.02, lambda: 1 / 0)
    timers.call_later(0.03, lambda: fired.append("after the failure"))
    timers.call_later(0.04, done.set)
    cancelled.cancel()
    release.set()
    assert done.wait(WAIT)
    assert fired == ["after the failure"]
    assert timers.pending() == 0


def test_an_earlier_timer_scheduled_later_wakes_the_thread():
    from vmcp_actors.concurrency import TimerQueue

    timers = TimerQueue()
    far = threading.Event()
    near = threading.Event()
    timers.call_later(60, far.set)
    timers.call_later(0.01, near.set)
    assert near.wait(WAIT) and not far.is_set()
    assert timers.pending() == 1
