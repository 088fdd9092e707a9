"""Triton's dynamic-batcher semantics, with a deterministic fake backend."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import replace

import numpy as np
import pytest

from tests.helpers.waiting import wait_until
from triton_nb.errors import InternalError, UnavailableError
from triton_nb.server.observability.stats import ModelStats
from triton_nb.server.scheduling.batcher import WORKER_TIMER_SLACK_NS, QueuePolicy, Scheduler, SchedulerSettings
from triton_nb.tensors import InferRequest, InferResponse


class FakeClock:
    """A clock that stands still until the test moves it (ns, like ``time.monotonic_ns``); it
    notes the threads that read it."""

    def __init__(self) -> None:
        self.now_ns = 0
        self.readers: set[str] = set()

    def __call__(self) -> int:
        self.readers.add(threading.current_thread().name)
        return self.now_ns


class Recorder:
    """A fake backend: records each batch (rows, request ids, the time on ``clock`` when it ran)
    and echoes the inputs."""

    def __init__(self, sleep_s: float = 0.0, fail_first: bool = False,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.batches: list[list[str]] = []
        self.rows: list[int] = []
        self.times_ns: list[int] = []
        self.sleep_s = sleep_s
        self.fail_first = fail_first
        self.clock = clock
        self.lock = threading.Lock()

    def __call__(self, instance, requests):
        with self.lock:
            self.batches.append([r.request_id for r in requests])
            self.rows.append(sum(r.inputs["x"].shape[0] for r in requests))
            self.times_ns.append(self.clock())
            fail = self.fail_first and len(self.batches) == 1
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if fail:
            raise InternalError("boom")
        return [InferResponse("m", 1, {"y": r.inputs["x"] * 2}, r.request_id) for r in requests]


def request(rid: str, rows: int = 1, width: int = 2, priority: int = 0, timeout_us: int = 0,
            clock: Callable[[], int] = time.monotonic_ns) -> InferRequest:
    return InferRequest("m", {"x": np.ones((rows, width), np.float32)}, request_id=rid, priority=priority,
                        timeout_microseconds=timeout_us, arrival_ns=clock())


def submit(scheduler: Scheduler, req: InferRequest) -> Future:
    future: Future = Future()
    scheduler.enqueue(req, future)
    return future


def make(settings: SchedulerSettings, recorder: Recorder, instances: int = 1, start: bool = True,
         clock: Callable[[], int] = time.monotonic_ns, stats: ModelStats | None = None) -> Scheduler:
    scheduler = Scheduler("m", 1, settings, recorder, clock_ns=clock, stats=stats)
    if start:
        for i in range(instances):
            scheduler.add_instance(object(), f"w{i}")
    return scheduler


DYNAMIC = SchedulerSettings(max_batch_size=8, dynamic_batching=True, max_queue_delay_microseconds=2_000_000)
MS = 1_000_000
WAIT_S = 30  # only keeps a broken scheduler from hanging the suite


def test_preferred_size_leaves_without_waiting_for_the_delay():
    clock = FakeClock()  # frozen: the 2 s delay never runs out, so only the preferred size can send the batch
    recorder = Recorder(clock=clock)
    scheduler = make(SchedulerSettings(**{**DYNAMIC.__dict__, "preferred_batch_size": (4,)}), recorder, clock=clock)
    futures = [submit(scheduler, request(str(i), clock=clock)) for i in range(4)]
    done, _ = wait(futures, timeout=WAIT_S)
    assert len(done) == 4, "the batch waited for the queue delay"
    assert recorder.rows == [4] and recorder.times_ns == [0]
    assert all(f.result().outputs["y"].shape == (1, 2) for f in futures)
    scheduler.stop()


def test_largest_reachable_preferred_size_and_rows_not_requests():
    recorder = Recorder()
    scheduler = make(SchedulerSettings(**{**DYNAMIC.__dict__, "preferred_batch_size": (2, 6)}), recorder,
                     start=False)
    futures = [submit(scheduler, request("a", rows=3)), submit(scheduler, request("b", rows=3)),
               submit(scheduler, request("c", rows=1))]
    scheduler.add_instance(object(), "w0")
    wait(futures[:2], timeout=5)
    assert recorder.batches[0] == ["a", "b"] and recorder.rows[0] == 6
    scheduler.stop(drain=False)


def test_delay_is_timed_from_the_oldest_request():
    clock = FakeClock()
    recorder = Recorder(clock=clock)
    settings = SchedulerSettings(max_batch_size=8, dynamic_batching=True, max_queue_delay_microseconds=600_000)
    scheduler = make(settings, recorder, clock=clock)
    futures = [submit(scheduler, request("old", clock=clock))]
    clock.now_ns = 400 * MS
    futures.append(submit(scheduler, request("new", clock=clock)))
    # due 600 ms after the oldest; timed from the newest it would be due at 1000 ms, and the clock
    # stays at 650 ms: that batch would never leave
    clock.now_ns = 650 * MS
    done, _ = wait(futures, timeout=WAIT_S)
    assert len(done) == 2, "the delay was not timed from the oldest request"
    assert recorder.batches == [["old", "new"]]
    assert recorder.times_ns == [650 * MS]  # not before the delay ran out: not at 0 or 400 ms
    scheduler.stop()


def test_max_batch_size_and_zero_delay():
    recorder = Recorder(sleep_s=0.01)
    settings = SchedulerSettings(max_batch_size=4, dynamic_batching=True, max_queue_delay_microseconds=0)
    scheduler = make(settings, recorder, start=False)
    futures = [submit(scheduler, request(str(i))) for i in range(10)]
    scheduler.add_instance(object(), "w0")
    wait(futures, timeout=5)
    assert sum(recorder.rows) == 10 and max(recorder.rows) == 4
    assert recorder.rows[:2] == [4, 4]
    scheduler.stop()


def test_requests_with_different_shapes_are_not_batched_together():
    recorder = Recorder()
    settings = SchedulerSettings(max_batch_size=8, dynamic_batching=True, max_queue_delay_microseconds=0)
    scheduler = make(settings, recorder, start=False)
    futures = [submit(scheduler, request("a", width=2)), submit(scheduler, request("b", width=3)),
               submit(scheduler, request("c", width=3))]
    scheduler.add_instance(object(), "w0")
    wait(futures, timeout=5)
    assert recorder.batches == [["a"], ["b", "c"]]
    scheduler.stop()


def test_without_dynamic_batching_requests_run_alone():
    recorder = Recorder()
    scheduler = make(SchedulerSettings(max_batch_size=8), recorder, start=False)
    futures = [submit(scheduler, request(str(i))) for i in range(3)]
    scheduler.add_instance(object(), "w0")
    wait(futures, timeout=5)
    assert recorder.batches == [["0"], ["1"], ["2"]]
    scheduler.stop()


def test_priorities_and_fifo_within_a_level():
    recorder = Recorder()
    settings = SchedulerSettings(max_batch_size=1, dynamic_batching=True, priority_levels=2,
                                 default_priority_level=2)
    scheduler = make(settings, recorder, start=False)
    futures = [submit(scheduler, request("low1")), submit(scheduler, request("low2", priority=2)),
               submit(scheduler, request("high", priority=1))]
    scheduler.add_instance(object(), "w0")
    wait(futures, timeout=5)
    assert recorder.batches == [["high"], ["low1"], ["low2"]]
    with pytest.raises(Exception, match=r"priority 3 is outside 1\.\.2"):
        submit(scheduler, request("x", priority=3))
    scheduler.stop()


def test_queue_full_is_rejected_at_once():
    settings = SchedulerSettings(max_batch_size=4, dynamic_batching=True,
                                 default_queue_policy=QueuePolicy(max_queue_size=2))
    scheduler = make(settings, Recorder(), start=False)
    submit(scheduler, request("a"))
    submit(scheduler, request("b"))
    with pytest.raises(UnavailableError, match="Exceeds maximum queue size"):
        submit(scheduler, request("c"))
    scheduler.stop(drain=False)


def test_timeout_reject_and_delay():
    clock = FakeClock()
    recorder = Recorder()
    reject = SchedulerSettings(max_batch_size=4, dynamic_batching=True, default_queue_policy=QueuePolicy(
        default_timeout_microseconds=50_000))
    scheduler = make(reject, recorder, start=False, clock=clock)
    late = submit(scheduler, request("late", clock=clock))
    clock.now_ns = 150 * MS  # past its 50 ms before any instance could start it
    scheduler.add_instance(object(), "w0")
    with pytest.raises(UnavailableError, match="Request timeout expired"):
        late.result(timeout=WAIT_S)
    assert recorder.batches == []
    scheduler.stop()

    clock = FakeClock()
    delay = SchedulerSettings(max_batch_size=1, dynamic_batching=True, default_queue_policy=QueuePolicy(
        default_timeout_microseconds=50_000, delay_on_timeout=True, allow_timeout_override=True))
    recorder = Recorder()
    scheduler = make(delay, recorder, start=False, clock=clock)
    slow = submit(scheduler, request("expired", clock=clock))
    clock.now_ns = 150 * MS
    fresh = submit(scheduler, request("fresh", timeout_us=10_000_000, clock=clock))  # override: not expired
    scheduler.add_instance(object(), "w0")
    wait([slow, fresh], timeout=WAIT_S)
    assert slow.result() and fresh.result()
    assert recorder.batches == [["fresh"], ["expired"]]  # the delayed one waits behind on-time ones
    scheduler.stop()


def test_preserve_ordering_across_instances():
    started = {rid: threading.Event() for rid in ("first", "second", "third")}

    def run_batch(instance, requests):
        rid = requests[0].request_id
        started[rid].set()
        if rid == "first":
            # "third" runs on the other instance only once that instance is done with "second":
            # "second" has finished executing before "first" does
            assert started["third"].wait(WAIT_S)
        return [InferResponse("m", 1, {}, r.request_id) for r in requests]

    order: list[str] = []
    settings = SchedulerSettings(max_batch_size=1, dynamic_batching=True, preserve_ordering=True)
    scheduler = Scheduler("m", 1, settings, run_batch)
    for i in range(2):
        scheduler.add_instance(object(), f"w{i}")
    futures: dict[str, Future] = {}
    for rid in started:  # callbacks before enqueueing: a future done already would run its callback at once
        futures[rid] = Future()
        futures[rid].add_done_callback(lambda f, n=rid: order.append(n))
    scheduler.enqueue(request("first"), futures["first"])
    assert started["first"].wait(WAIT_S)  # dispatched before "second" is queued
    scheduler.enqueue(request("second"), futures["second"])
    scheduler.enqueue(request("third"), futures["third"])
    done, _ = wait(futures.values(), timeout=WAIT_S)
    assert len(done) == 3
    assert [futures[rid].result().request_id for rid in started] == list(started)
    assert order == ["first", "second", "third"]
    scheduler.stop()


def test_a_failing_batch_fails_its_requests_only():
    recorder = Recorder(fail_first=True)
    scheduler = make(SchedulerSettings(max_batch_size=4), recorder)
    bad = submit(scheduler, request("a"))
    with pytest.raises(InternalError, match="boom"):
        bad.result(timeout=5)
    assert submit(scheduler, request("b")).result(timeout=5).request_id == "b"
    scheduler.stop()


@pytest.mark.parametrize("error", [ValueError("bad"), SystemExit("bye")], ids=["exception", "system-exit"])
def test_whatever_a_backend_raises_fails_that_batch_and_the_worker_serves_on(error):
    calls = []

    def run_batch(instance, requests):
        calls.append(len(requests))
        if len(calls) == 1:
            raise error
        return [InferResponse(model_name="m", model_version=1, request_id=r.request_id) for r in requests]

    scheduler = Scheduler("m", 1, SchedulerSettings(max_batch_size=4), run_batch)
    scheduler.add_instance(object(), "w0")
    with pytest.raises(InternalError, match=rf"model 'm': {type(error).__name__}: {error}"):
        submit(scheduler, request("a")).result(timeout=5)
    assert submit(scheduler, request("b")).result(timeout=5).request_id == "b"
    scheduler.stop()


def test_live_update_applies_to_the_next_batch():
    recorder = Recorder()
    scheduler = make(SchedulerSettings(**{**DYNAMIC.__dict__, "preferred_batch_size": (4,)}), recorder)
    scheduler.update(preferred_batch_size=(2,))
    futures = [submit(scheduler, request(str(i))) for i in range(2)]
    wait(futures, timeout=5)
    assert recorder.rows == [2]
    scheduler.stop()


def test_stop_fails_or_drains_queued_requests_and_joins_workers():
    scheduler = make(SchedulerSettings(max_batch_size=4), Recorder(), start=False)
    queued = submit(scheduler, request("q"))
    scheduler.stop(drain=False)
    with pytest.raises(UnavailableError, match="unloaded"):
        queued.result(timeout=1)
    with pytest.raises(UnavailableError, match="unloading"):
        submit(scheduler, request("after"))
    recorder = Recorder(sleep_s=0.05)
    scheduler = make(SchedulerSettings(max_batch_size=4), recorder, start=False)
    pending = [submit(scheduler, request(str(i))) for i in range(3)]
    scheduler.add_instance(object(), "w0")
    instances = scheduler.stop(drain=True)
    assert all(f.result(timeout=0).request_id for f in pending)
    assert len(instances) == 1
    assert not [t for t in threading.enumerate() if t.name == "w0"]


def test_instances_can_be_added_and_retired_live():
    recorder = Recorder()
    scheduler = make(SchedulerSettings(max_batch_size=4), recorder, instances=1)
    scheduler.add_instance(object(), "extra")
    assert scheduler.instance_count == 2
    retired = scheduler.retire_instances(1)
    assert len(retired) == 1 and scheduler.instance_count == 1
    assert submit(scheduler, request("still")).result(timeout=5).request_id == "still"
    scheduler.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is a Linux thread setting")
def test_workers_ask_for_timed_waits_that_end_on_time():
    import ctypes
    import ctypes.util

    prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").prctl
    pr_get_timerslack = 30
    seen: list[int] = []

    def backend(instance, requests):
        seen.append(prctl(pr_get_timerslack, 0, 0, 0, 0))  # read on the worker thread that executes
        return [InferResponse("m", 1, {"y": r.inputs["x"]}, r.request_id) for r in requests]

    scheduler = Scheduler("m", 1, SchedulerSettings(max_batch_size=8, dynamic_batching=True), backend)
    scheduler.add_instance(object(), "w0")
    assert submit(scheduler, request("a")).result(timeout=30)
    scheduler.stop()
    assert seen == [WORKER_TIMER_SLACK_NS]


# ---------------------------------------------------------------------- why a batch left (beyond Triton)
class Held(Recorder):
    """A Recorder whose batches wait for ``release``; ``running`` is set once one has started."""

    def __init__(self, clock: Callable[[], int]) -> None:
        super().__init__(clock=clock)
        self.running = threading.Event()
        self.release = threading.Event()

    def __call__(self, instance, requests):
        self.running.set()
        assert self.release.wait(WAIT_S), "the test never released the batch"
        return super().__call__(instance, requests)


def counting(settings: SchedulerSettings, backend: type[Recorder] = Recorder, start: bool = True
             ) -> tuple[Scheduler, ModelStats, Recorder, FakeClock]:
    """A scheduler on a frozen clock that counts into fresh stats (its instance "w0" started or not)."""
    clock = FakeClock()
    stats = ModelStats("m", 1)
    recorder = backend(clock=clock)
    return make(settings, recorder, start=start, clock=clock, stats=stats), stats, recorder, clock


def delayed(delay_us: int) -> SchedulerSettings:
    return SchedulerSettings(max_batch_size=8, dynamic_batching=True, max_queue_delay_microseconds=delay_us)


def counted(stats: ModelStats) -> dict[str, dict[int, int]]:
    """The reasons that were counted: reason -> {rows: batches}."""
    return {reason: sizes for reason, sizes in stats.batch_reasons().items() if sizes}


def settle(futures: list[Future]) -> None:
    done, _ = wait(futures, timeout=WAIT_S)
    assert len(done) == len(futures), "a request was never answered"


def test_a_full_batch_and_rows_that_do_not_fit_count_as_max_batch_size():
    # the clock is frozen: the 2 s delay never runs out, so it cannot be why a batch left
    scheduler, stats, recorder, clock = counting(DYNAMIC, start=False)
    # 8 rows: full; 5 rows, then 4 that would not fit beside them; the 4 wait for the delay
    futures = [submit(scheduler, request(rid, rows=rows, clock=clock)) for rid, rows in (("a", 8), ("b", 5), ("c", 4))]
    scheduler.add_instance(object(), "w0")
    settle(futures[:2])
    assert not futures[2].done()
    scheduler.stop(drain=True)  # the unloading drains the 4 rows without waiting for the delay
    settle(futures)
    assert recorder.rows == [8, 5, 4]
    assert counted(stats) == {"max_batch_size": {8: 1, 5: 1}, "draining": {4: 1}}


def test_a_preferred_size_and_max_batch_size_beside_preferred_sizes():
    scheduler, stats, recorder, clock = counting(replace(DYNAMIC, preferred_batch_size=(2, 6)), start=False)
    # 3 + 3 reach 6, a preferred size; then 1 row that 8 more cannot join; then 8, no preferred
    # size but max_batch_size
    futures = [submit(scheduler, request(rid, rows=rows, clock=clock))
               for rid, rows in (("a", 3), ("b", 3), ("c", 1), ("d", 8))]
    scheduler.add_instance(object(), "w0")
    settle(futures)
    scheduler.stop()
    assert recorder.batches == [["a", "b"], ["c"], ["d"]]
    assert counted(stats) == {"preferred_batch_size": {6: 1}, "max_batch_size": {1: 1, 8: 1}}


def test_a_batch_held_until_the_delay_runs_out_counts_as_max_queue_delay():
    scheduler, stats, _, clock = counting(delayed(600_000))
    wait_until(lambda: "w0" in clock.readers, "the instance to take the forming turn")
    future = submit(scheduler, request("alone", rows=2, clock=clock))
    clock.now_ns = 650 * MS  # the delay (600 ms from the request) runs out while the instance waits
    settle([future])
    scheduler.stop()
    assert counted(stats) == {"max_queue_delay": {2: 1}}


def test_a_delay_spent_while_the_instance_was_busy_counts_as_instance_free():
    scheduler, stats, recorder, clock = counting(delayed(100_000), backend=Held)
    assert isinstance(recorder, Held)
    first = submit(scheduler, request("full", rows=8, clock=clock))
    assert recorder.running.wait(WAIT_S)
    queued = submit(scheduler, request("queued", clock=clock))
    clock.now_ns = 200 * MS  # its delay (100 ms) runs out while the only instance is busy
    recorder.release.set()
    settle([first, queued])
    scheduler.stop()
    assert recorder.batches == [["full"], ["queued"]]
    assert counted(stats) == {"max_batch_size": {8: 1}, "instance_free": {1: 1}}


def test_no_delay_counts_as_instance_free_even_for_a_waiting_instance():
    scheduler, stats, _, clock = counting(delayed(0))
    wait_until(lambda: "w0" in clock.readers, "the instance to take the forming turn")
    clock.now_ns = 5 * MS  # the request arrives after the instance began to wait for one
    settle([submit(scheduler, request("a", rows=3, clock=clock))])
    scheduler.stop()
    assert counted(stats) == {"instance_free": {3: 1}}


def test_a_request_of_another_shape_sends_the_batch_before_it():
    scheduler, stats, recorder, clock = counting(delayed(0), start=False)
    futures = [submit(scheduler, request(rid, width=width, clock=clock))
               for rid, width in (("a", 2), ("b", 3), ("c", 3))]
    scheduler.add_instance(object(), "w0")
    settle(futures)
    scheduler.stop()
    assert recorder.batches == [["a"], ["b", "c"]]
    assert counted(stats) == {"different_shape": {1: 1}, "instance_free": {2: 1}}


def test_without_dynamic_batching_each_request_counts_alone_and_a_rejected_one_not_at_all():
    scheduler, stats, _, clock = counting(SchedulerSettings(max_batch_size=8), start=False)
    futures = [submit(scheduler, request(str(rows), rows=rows, clock=clock)) for rows in (2, 1, 3)]
    scheduler.add_instance(object(), "w0")
    settle(futures)
    scheduler.stop()
    assert counted(stats) == {"no_dynamic_batching": {2: 1, 1: 1, 3: 1}}

    scheduler, stats, _, clock = counting(DYNAMIC, start=False)
    too_big = submit(scheduler, request("big", rows=4, clock=clock))
    scheduler.update(max_batch_size=2)  # lowered after it was queued: it is failed, never batched
    scheduler.add_instance(object(), "w0")
    assert too_big.exception(timeout=WAIT_S) is not None
    scheduler.stop()
    assert counted(stats) == {}
