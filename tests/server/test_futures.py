"""ResponseFuture keeps the concurrent.futures.Future contract while building its condition lazily."""

import asyncio
import threading
from concurrent.futures import CancelledError, Future, InvalidStateError, as_completed, wait
from concurrent.futures import TimeoutError as FutureTimeoutError

import pytest

from triton_nb.server.futures import ResponseFuture


def test_is_a_future_and_builds_no_condition_until_waited_on():
    future = ResponseFuture()
    assert isinstance(future, Future)
    seen = []
    future.add_done_callback(seen.append)
    future.set_result(7)
    assert future._cond is None  # nobody blocked: no condition was built
    assert future.result() == 7 and future.exception() is None and future.done()
    assert seen == [future]
    late = []
    future.add_done_callback(late.append)  # added after the fact: called at once
    assert late == [future]


def test_a_second_resolution_is_refused():
    future = ResponseFuture()
    future.set_exception(ValueError("bad"))
    with pytest.raises(InvalidStateError):
        future.set_result(1)
    with pytest.raises(ValueError, match="bad"):
        future.result()
    assert isinstance(future.exception(), ValueError)


def test_result_blocks_until_another_thread_resolves_it_and_times_out_otherwise():
    future = ResponseFuture()
    with pytest.raises(FutureTimeoutError):
        future.result(timeout=0.01)
    release = threading.Event()

    def resolve():
        release.wait()
        future.set_result("late")

    thread = threading.Thread(target=resolve)
    thread.start()
    release.set()
    assert future.result(timeout=10) == "late"
    thread.join()


def test_cancel_only_while_pending():
    pending = ResponseFuture()
    called = []
    pending.add_done_callback(called.append)
    assert pending.cancel() and pending.cancelled() and called == [pending]
    with pytest.raises(CancelledError):
        pending.result()
    assert not pending.set_running_or_notify_cancel()
    running = ResponseFuture()
    assert running.set_running_or_notify_cancel() and running.running()
    assert not running.cancel()
    finished = ResponseFuture()
    finished.set_result(None)
    assert not finished.cancel()


def test_standard_library_wait_and_as_completed_accept_it():
    futures = [ResponseFuture() for _ in range(3)]
    timer = threading.Timer(0.01, lambda: [f.set_result(i) for i, f in enumerate(futures)])
    timer.start()
    done, not_done = wait(futures, timeout=10)
    assert len(done) == 3 and not not_done
    assert sorted(f.result() for f in as_completed(futures, timeout=10)) == [0, 1, 2]
    timer.join()


def test_asyncio_wrap_future_resolves_on_the_loop():
    async def main():
        future = ResponseFuture()
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, lambda: threading.Thread(target=future.set_result, args=("ok",)).start())
        return await asyncio.wait_for(asyncio.wrap_future(future), 10)

    assert asyncio.run(main()) == "ok"


def test_a_failing_callback_does_not_stop_the_others(caplog):
    future = ResponseFuture()
    seen = []
    future.add_done_callback(lambda f: 1 / 0)
    future.add_done_callback(seen.append)
    future.set_result(None)
    assert seen == [future]
    assert "exception calling callback" in caplog.text
