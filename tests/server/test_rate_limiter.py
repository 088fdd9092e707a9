"""Triton's rate limiter: an instance runs only when its resources are free; priorities weight turns."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.helpers.rate_limited_models import write_held_models
from tests.helpers.waiting import wait_until
from triton_nb.errors import InvalidArgumentError
from triton_nb.server.scheduling.rate_limiter import RateLimiter, Resource, parse_rate_limit_resource
from triton_nb.serving import serve

WAIT_S = 30


def test_resource_flags_parse_as_tritonserver_takes_them():
    assert parse_rate_limit_resource("R1:10") == ("R1", 10, None)
    assert parse_rate_limit_resource("R2:5:1") == ("R2", 5, 1)
    for bad in ("R1", ":3", "R1:x", "R1:-1", "R1:2:-1", "R1:2:0:9"):
        with pytest.raises(InvalidArgumentError, match="NAME:COUNT"):
            parse_rate_limit_resource(bad)


def test_default_copies_are_the_most_any_instance_needs_per_device_or_globally():
    limiter = RateLimiter()
    limiter.register("a", 0, [Resource("R1", 4), Resource("R2", 4)], 1)
    limiter.register("b", 0, [Resource("R2", 5), Resource("R3", 10, is_global=True)], 1)
    limiter.register("c", 1, [Resource("R1", 1), Resource("R3", 7, is_global=True)], 1)
    assert limiter.capacity("R1", 0) == 4 and limiter.capacity("R2", 0) == 5
    assert limiter.capacity("R1", 1) == 1 and limiter.capacity("R3", None) == 10


def test_set_copies_override_the_default_and_bound_what_an_instance_may_ask():
    limiter = RateLimiter(["R1:10", "R2:5:0", "R2:8:1", "R3:2"])
    assert limiter.capacity("R1", 0) == limiter.capacity("R1", 1) == 10
    assert (limiter.capacity("R2", 0), limiter.capacity("R2", 1)) == (5, 8)
    with pytest.raises(InvalidArgumentError, match=r"model 'big'.*needs 6 of rate limiter resource 'R2'.*only 5"):
        limiter.register("big", 0, [Resource("R2", 6)], 1)
    limiter.register("fits", 1, [Resource("R2", 6)], 1)


def overlapping(limiter: RateLimiter, gates, rounds: int = 20) -> int:
    """Run each gate's holder in its own thread; how often more than one held at once."""
    holding = []
    most = [0]
    lock = threading.Lock()

    def hold(gate) -> None:
        for _ in range(rounds):
            with gate:
                with lock:
                    holding.append(gate)
                    most[0] = max(most[0], len(holding))
                time.sleep(0.001)
                with lock:
                    holding.remove(gate)

    threads = [threading.Thread(target=hold, args=(g,)) for g in gates]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    return most[0]


def acquired_meanwhile(holding, other, wait_s: float = 1.0) -> bool:
    """While ``holding`` is held, can ``other`` be taken (in another thread, within ``wait_s``)?

    A second is enough to show that it cannot; where it can, callers wait ``WAIT_S``, as a loaded
    machine may take more than a second to start the thread."""
    taken = threading.Event()

    def take() -> None:
        with other:
            taken.set()

    with holding:
        thread = threading.Thread(target=take)
        thread.start()
        got = taken.wait(wait_s)
    thread.join(WAIT_S)
    return got


def test_instances_needing_one_copy_never_run_together_unless_on_other_devices():
    limiter = RateLimiter()
    shared = [limiter.register(m, 0, [Resource("R", 1)], 1) for m in ("a", "b", "c")]
    assert overlapping(limiter, shared) == 1
    assert not acquired_meanwhile(shared[0], shared[1])
    apart = RateLimiter()
    a, b = (apart.register(m, d, [Resource("R", 1)], 1) for m, d in (("a", 0), ("b", 1)))
    assert acquired_meanwhile(a, b, WAIT_S)  # each device has its own copy
    globally = RateLimiter()
    a, b = (globally.register(m, d, [Resource("R", 1, is_global=True)], 1) for m, d in (("a", 0), ("b", 1)))
    assert not acquired_meanwhile(a, b)  # one global copy for both devices
    two = RateLimiter(["R:2"])
    a, b = (two.register(m, 0, [Resource("R", 1)], 1) for m in ("a", "b"))
    assert acquired_meanwhile(a, b, WAIT_S)
    gone = RateLimiter()
    a, b = (gone.register(m, 0, [Resource("R", need)], 1) for m, need in (("a", 1), ("b", 2)))
    assert gone.capacity("R", 0) == 2
    b.close()  # an unloaded instance no longer sizes the pool
    assert gone.capacity("R", 0) == 1


def test_a_priority_of_two_gets_half_the_turns():
    limiter = RateLimiter()
    first = limiter.register("first", 0, [Resource("R", 1)], 1)
    second = limiter.register("second", 0, [Resource("R", 1)], 2)
    blocker = limiter.register("blocker", 0, [Resource("R", 1)], 1)
    order: list[str] = []
    stop = threading.Event()

    def contend(gate, name) -> None:
        while not stop.is_set():
            with gate:
                order.append(name)
                if len(order) >= 60:
                    stop.set()
                time.sleep(0.0005)

    with blocker:  # both start waiting before anyone is granted
        threads = [threading.Thread(target=contend, args=(g, n)) for g, n in ((first, "first"), (second, "second"))]
        for thread in threads:
            thread.start()
        wait_until(lambda: first.waiting and second.waiting, "both to wait for the resource")
    for thread in threads:
        thread.join(WAIT_S)
    granted = order[:60]
    assert granted.count("first") > granted.count("second") > 0


class _GrpcCalls:
    """``async_infer(model, {"X": x})`` over tritonclient.grpc, answers as ``get_result``-able."""

    def __init__(self, server) -> None:
        import tritonclient.grpc as grpcclient

        self.module = grpcclient
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")

    def async_infer(self, model: str, inputs: dict[str, np.ndarray]):
        from concurrent.futures import Future

        answer: Future = Future()
        tensor = self.module.InferInput("X", list(inputs["X"].shape), "FP32")
        tensor.set_data_from_numpy(inputs["X"])
        self.client.async_infer(model, [tensor], lambda result, error: answer.set_exception(error) if error
                                else answer.set_result(result))

        class _Result:
            def get_result(self, timeout=None):
                return answer.result(timeout)

        return _Result()


def held_pair_runs_together(server, folders, protocol: str = "inprocess", *, expected: bool) -> bool:
    """Hold held_a's batch; report whether held_b's batch started meanwhile (then let both end).
    Where it should start it gets the whole wait (a busy machine may be slow to start it); where
    it should not, half a second is long enough for an unlimited instance to start."""
    client = server.client() if protocol == "inprocess" else _GrpcCalls(server)
    x = np.ones((1, 2), np.float32)
    try:
        first = client.async_infer("held_a", {"X": x})
        wait_until((folders["held_a"] / "running").exists, "held_a to start")
        second = client.async_infer("held_b", {"X": x})
        deadline = time.monotonic() + (WAIT_S if expected else 0.5)
        while time.monotonic() < deadline and not (folders["held_b"] / "running").exists():
            time.sleep(0.005)
        together = (folders["held_b"] / "running").exists()
    finally:
        for folder in folders.values():
            (folder / "open").touch()
    np.testing.assert_array_equal(first.get_result(timeout=WAIT_S).as_numpy("Y"), x * 2)
    np.testing.assert_array_equal(second.get_result(timeout=WAIT_S).as_numpy("Y"), x * 2)
    return together


@pytest.mark.parametrize(("is_global", "protocol"), [(False, "inprocess"), (True, "inprocess"), (False, "grpc")])
def test_served_models_sharing_one_copy_run_one_at_a_time(tmp_path, is_global, protocol):
    folders = write_held_models(tmp_path, is_global=is_global)
    with serve(tmp_path, rate_limit="execution_count", grpc_port=0) as server:
        assert not held_pair_runs_together(server, folders, protocol, expected=False)
        queue = server.statistics("held_b")["model_stats"][0]["inference_stats"]["queue"]
        assert queue["count"] == 1  # its wait for the resource is queue time, as in Triton


def test_without_rate_limiting_the_rate_limiter_blocks_are_ignored(tmp_path):
    folders = write_held_models(tmp_path)
    with serve(tmp_path) as server:  # rate_limit="off", Triton's default
        assert held_pair_runs_together(server, folders, expected=True)


def test_more_set_copies_let_them_run_together(tmp_path):
    folders = write_held_models(tmp_path)
    with serve(tmp_path, rate_limit="execution_count", rate_limit_resources=["R:2"]) as server:
        assert held_pair_runs_together(server, folders, expected=True)


def test_an_instance_needing_more_than_the_set_copies_fails_its_load(tmp_path):
    write_held_models(tmp_path, ("held_a",))
    with serve(tmp_path, rate_limit="execution_count", rate_limit_resources=["R:0"]) as server:
        state = {e["name"]: e for e in server.repository_index()}["held_a"]
        assert state["state"] == "UNAVAILABLE" and "rate limiter resource 'R'" in state["reason"]


def test_rate_limit_options_are_checked():
    with pytest.raises(InvalidArgumentError, match="rate_limit must be one of off, execution_count"):
        serve(".", rate_limit="fast")
    with pytest.raises(InvalidArgumentError, match="need rate_limit='execution_count'"):
        serve(".", rate_limit_resources=["R:1"])


def test_the_serve_command_names_its_own_flags(tmp_path, capsys):
    from triton_nb.cli import main

    write_held_models(tmp_path, ("held_a",))
    assert main(["serve", "--model-repository", str(tmp_path), "--rate-limit-resource", "R:1"]) == 2
    assert "--rate-limit-resource needs --rate-limit execution_count" in capsys.readouterr().err
    assert main(["serve", "--model-repository", str(tmp_path), "--rate-limit", "execution_count",
                 "--rate-limit-resource", "R:x"]) == 2
    assert "rate limit resource 'R:x' must be NAME:COUNT" in capsys.readouterr().err
