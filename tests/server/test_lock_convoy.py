"""Two instances answering batches at once must not turn the request path's locks into a convoy.

Each answer sends the next request of a closed loop from the thread that answered (what the perf
engine and a client's callbacks do), so two model instances' threads take the scheduler's lock,
and the load's, in turn for every request. With plain locks, once one of them lost the GIL while
holding a lock, every later acquisition was handed to a sleeping thread: about two thread
switches a request, and 2.7 times fewer requests a second than one instance
(``bench/bench_python_instances.py`` prints the figures). The tests count the threads' voluntary
switches (``getrusage``), not time: a convoy shows as switches per request, however fast the machine.

The lock itself (:class:`triton_nb._locks.YieldingLock`) is tested for what a lock must do.
"""

from __future__ import annotations

import itertools
import resource
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.scale_models import write_scale_model
from triton_nb import serve
from triton_nb._locks import YieldingLock
from triton_nb.perf.load import InProcessLoad
from triton_nb.tensors import InferRequest

IN_FLIGHT = 64
REQUESTS = 6000
# A convoy costs about two switches a request (measured 1.7); without one, a few per 5 ms slice
# of the interpreter's lock, a small fraction of a switch per request.
MAX_SWITCHES_PER_REQUEST = 0.5


def voluntary_switches() -> int:
    """The process's voluntary context switches so far, all its threads together."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


@pytest.fixture
def two_instances(tmp_path: Path) -> Path:
    # batches of 8 from 64 in flight: both instances always have a batch, so both answer at once
    write_scale_model(tmp_path, max_batch_size=8, count=2,
                      extra="dynamic_batching { max_queue_delay_microseconds: 100 }")
    return tmp_path


def test_closed_loop_from_callbacks_makes_no_convoy(two_instances: Path) -> None:
    with serve(two_instances) as server:
        rows = [np.full((1, 2), i, np.float32) for i in range(IN_FLIGHT)]
        # the loop's own bookkeeping takes no lock (itertools.count and list.append are atomic):
        # a lock here would be the test's own convoy, not the server's
        tickets, retired = itertools.count(IN_FLIGHT), itertools.count(1)
        wrong: list[int] = []
        answered: list[int] = []
        done = threading.Event()

        def send(index: int) -> None:
            future = server.infer_async(InferRequest("scale", {"X": rows[index % IN_FLIGHT]}))
            future.add_done_callback(lambda f, i=index: answer(f, i))

        def answer(future, index: int) -> None:
            if not np.array_equal(future.result().outputs["Y"], rows[index % IN_FLIGHT] * 2):
                wrong.append(index)
            answered.append(index)
            ticket = next(tickets)
            if ticket < REQUESTS:
                send(ticket)  # from the thread that answered, as a closed loop does
            elif next(retired) == IN_FLIGHT:  # the last slot to end
                done.set()

        for index in range(IN_FLIGHT * 4):  # warm: both instances, the model's first calls
            server.infer(InferRequest("scale", {"X": rows[index % IN_FLIGHT]}))
        before = voluntary_switches()
        for index in range(IN_FLIGHT):
            send(index)
        assert done.wait(120), f"only {len(answered)} of {REQUESTS} requests answered"
        switches = voluntary_switches() - before
        (stats,) = server.statistics("scale")["model_stats"]
    assert not wrong
    assert sorted(answered) == list(range(REQUESTS))
    assert int(stats["inference_count"]) == REQUESTS + IN_FLIGHT * 4
    per_request = switches / len(answered)
    assert per_request < MAX_SWITCHES_PER_REQUEST, (
        f"{switches} thread switches for {len(answered)} requests ({per_request:.2f} a request): a lock convoy")


def test_perf_load_from_callbacks_makes_no_convoy(two_instances: Path) -> None:
    with serve(two_instances) as server:
        requests = [{"X": np.full((1, 2), i, np.float32)} for i in range(IN_FLIGHT)]
        for tensors in requests * 4:
            server.infer(InferRequest("scale", tensors))
        before = voluntary_switches()
        load = InProcessLoad(server, "scale", requests, concurrency=IN_FLIGHT)
        load.start()
        answered = 0
        deadline = threading.Event()
        while answered < REQUESTS and not deadline.wait(0.05):
            completions = load.take()
            assert completions.ok.all()
            answered += len(completions.ok)
        load.stop()
        answered += len(load.take().ok)
        switches = voluntary_switches() - before
    per_request = switches / answered
    assert per_request < MAX_SWITCHES_PER_REQUEST, (
        f"{switches} thread switches for {answered} requests ({per_request:.2f} a request): a lock convoy")


# ---------------------------------------------------------------- the lock


@pytest.mark.parametrize("reentrant", [False, True])
def test_yielding_lock_excludes(reentrant: bool) -> None:
    lock = YieldingLock(reentrant=reentrant)
    total = [0]

    def add() -> None:
        for _ in range(20_000):
            with lock:
                value = total[0]
                total[0] = value + 1

    threads = [threading.Thread(target=add) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert total[0] == 80_000


def test_yielding_lock_waits_for_a_holder_that_keeps_it() -> None:
    lock = YieldingLock()
    held, release = threading.Event(), threading.Event()
    got = []

    def holder() -> None:
        with lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(10)
    assert not lock.acquire(blocking=False)
    assert not lock.acquire(timeout=0.01)
    waiter = threading.Thread(target=lambda: got.append(lock.acquire()))  # past its yields: blocks
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not got
    release.set()
    waiter.join(10)
    thread.join(10)
    assert got == [True]
    lock.release()


def test_yielding_lock_serves_a_condition_reentrantly() -> None:
    lock = YieldingLock(reentrant=True)
    condition = threading.Condition(lock)
    ready = []

    def notifier() -> None:
        with condition:
            ready.append(1)
            condition.notify_all()

    with condition, lock:  # held twice: the wait releases both levels and takes both back
        thread = threading.Thread(target=notifier)
        thread.start()
        assert condition.wait_for(lambda: ready, timeout=10)
    thread.join(10)
    assert lock.acquire(blocking=False)  # free again: both levels were released
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()  # an RLock refuses a release it does not hold


@pytest.mark.parametrize("reentrant", [False, True])
def test_yielding_lock_is_the_plain_lock_where_the_interpreter_has_no_gil(monkeypatch, reentrant: bool) -> None:
    """On a free-threaded interpreter there is no GIL to yield and RLock's internals are not ours to
    rely on: the plain lock, which still serves a condition."""
    import triton_nb._locks as locks

    monkeypatch.setattr(locks, "_GIL_ENABLED", False)
    lock = YieldingLock(reentrant=reentrant)
    assert type(lock) is type(threading.RLock() if reentrant else threading.Lock())
    condition = threading.Condition(lock)
    with condition:
        assert not condition.wait(timeout=0.01)


def test_yielding_lock_matches_the_interpreter() -> None:
    """With the GIL (every interpreter CI runs), the yielding lock; without it, the plain one."""
    import sys

    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    assert isinstance(YieldingLock(), YieldingLock) is gil
