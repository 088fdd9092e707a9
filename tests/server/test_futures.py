"""ResponseFuture keeps the concurrent.futures.Future contract while building its condition lazily."""

import asyncio
import threading
from concurrent.futures import CancelledError, Future, InvalidStateError, as_completed, wait
from concurrent.futures import TimeoutError as FutureTimeoutError

import pytest

from tests.helpers.waiting import wait_until
from triton_nb.server.scheduling.futures import ResponseFuture


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


def _blocked_count(future: ResponseFuture) -> int:
    return len(future._blocked or [])


def _wait_blocked(future: ResponseFuture, count: int) -> None:
    wait_until(lambda: _blocked_count(future) >= count, f"{count} callers blocked in the future",
               every_s=0.001)


@pytest.mark.parametrize("outcome", ["result", "exception", "cancel"])
def test_every_blocked_caller_wakes_with_the_outcome_and_none_builds_a_condition(outcome):
    future = ResponseFuture()
    seen: list[tuple[str, object]] = []

    def call(method: str) -> None:
        try:
            seen.append((method, getattr(future, method)(timeout=10)))
        except BaseException as error:
            seen.append((method, type(error)))

    threads = [threading.Thread(target=call, args=(method,)) for method in ("result", "exception", "result")]
    for thread in threads:
        thread.start()
    _wait_blocked(future, 3)
    error = KeyError("k")
    if outcome == "result":
        future.set_result("done")
    elif outcome == "exception":
        future.set_exception(error)
    else:
        assert future.cancel()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    expected = {"result": ("done", None), "exception": (KeyError, error),
                "cancel": (CancelledError, CancelledError)}[outcome]
    assert sorted(seen, key=lambda item: item[0]) == [
        ("exception", expected[1]), ("result", expected[0]), ("result", expected[0])]
    assert future._cond is None and future._blocked is None


def test_a_caller_that_timed_out_leaves_nothing_behind_for_the_next():
    future = ResponseFuture()
    for timeout in (0, 0.01, -1.0):  # a negative timeout is no wait at all, as for a Condition
        with pytest.raises(FutureTimeoutError):
            future.result(timeout=timeout)
        assert _blocked_count(future) == 0
    answer = []
    thread = threading.Thread(target=lambda: answer.append(future.result(timeout=10)))
    thread.start()
    _wait_blocked(future, 1)
    future.set_result(3)
    thread.join(10)
    assert answer == [3] and future.result(timeout=0) == 3


def test_blocked_callers_and_the_standard_library_wait_share_one_outcome():
    future = ResponseFuture()
    answers: list[object] = []
    blocked = threading.Thread(target=lambda: answers.append(future.result(timeout=10)))
    blocked.start()
    _wait_blocked(future, 1)
    waiting = threading.Thread(target=lambda: answers.append(len(wait([future], timeout=10).done)))
    waiting.start()
    # wait() builds the condition; the blocked caller does not need it
    wait_until(lambda: future._cond is not None, "wait() to build the condition", every_s=0.001)
    future.set_result("both")
    for thread in (blocked, waiting):
        thread.join(10)
    assert sorted(map(str, answers)) == ["1", "both"]


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
