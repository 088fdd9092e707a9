"""The in-process client's ``infer_frame``: a DataFrame of any length, in pieces of at most
``max_batch_size`` rows sent together, answered as one DataFrame in the frame's order."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import triton_nb
from tests.helpers.scale_models import write_gated_model, write_python_model
from triton_nb import fraud
from triton_nb.errors import InvalidArgumentError, NotFoundError, UnavailableError

ROOT = Path(__file__).resolve().parents[1]

# Y = X * the version number, Z = X + 1; a request holding a NaN fails alone, with Triton's INVALID_ARG.
DOUBLE_CONFIG = """
name: "double"
backend: "python"
max_batch_size: 4
version_policy: { all { } }
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "Z" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 0 priority_levels: 2 default_priority_level: 1 }
"""

DOUBLE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.factor = float(args["model_version"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if not np.isfinite(x).all():
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError("X has NaN", pb_utils.TritonError.INVALID_ARG)))
                continue
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", x * self.factor), pb_utils.Tensor("Z", x + 1)]))
        return responses
'''

# Models that do not batch: each request is one sample of the dims; "single" takes one value, "pair" two.
UNBATCHED_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {width} ] }} ]
"""

UNBATCHED_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                                                            .as_numpy() * 3)]) for r in requests]
'''


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A server with "double" (versions 1 and 2), "single" and "pair"."""
    repo = tmp_path_factory.mktemp("repo")
    folder = write_python_model(repo, "double", DOUBLE_CONFIG, DOUBLE_MODEL)
    (folder / "2").mkdir()
    (folder / "2" / "model.py").write_text(DOUBLE_MODEL)
    for name, width in (("single", 1), ("pair", 2)):
        write_python_model(repo, name, UNBATCHED_CONFIG.format(name=name, width=width), UNBATCHED_MODEL)
    with triton_nb.serve(repo) as server:
        yield server


@pytest.fixture
def gated(tmp_path):
    folder = write_gated_model(tmp_path, width=1)  # one value per row, so a DataFrame column feeds it
    server = triton_nb.serve(tmp_path)
    try:
        yield server, folder
    finally:
        (folder / "open").touch()  # a stop waits for the batch that is executing
        server.stop()


def _until(condition, what: str, limit_s: float = 30.0) -> None:
    """Wait for ``condition()`` (the server's threads move on their own); fail naming ``what``."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.005)


def _counts(server, model: str) -> tuple[int, int]:
    stats = server.client().get_inference_statistics(model)["model_stats"]
    return (sum(s["inference_stats"]["success"]["count"] for s in stats),
            sum(s["inference_stats"]["fail"]["count"] for s in stats))


def _xs(values, index=None) -> pd.DataFrame:
    return pd.DataFrame({"X": np.asarray(values, dtype=np.float32)}, index=index)


def _reference_predictions(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """What the checked-in repository's model says of ``rows``, from its files without a server
    (its encoders, then its XGBoost trees with FIL's threshold), and which rows sit so far from
    the threshold that FIL's float32 sum cannot decide them."""
    import xgboost as xgb

    from triton_nb.repository import load_config

    repository = ROOT / "model_repository"
    preprocessor = fraud.FraudPreprocessor.load_encoders(repository / "preprocessing" / "1")
    booster = xgb.Booster(model_file=str(repository / "fil" / "1" / "xgboost.json"))
    threshold = float(load_config(repository / "fil").parameters["threshold"].string_value)
    proba = booster.inplace_predict(preprocessor.transform(rows))
    return (proba > threshold).astype(np.float32), np.abs(proba - threshold) > 1e-4


def test_fraud_frame_of_two_and_a_half_batches():
    with triton_nb.serve(ROOT / "model_repository") as server:
        client = server.client()
        limit = client.get_model_config("ensemble")["max_batch_size"]
        assert limit == 4096
        # shuffled: the index is out of order, so keeping the index and keeping the order are both tested
        frame = fraud.generate_transactions(limit * 5 // 2, seed=11, fraud_rate=0.05).sample(frac=1, random_state=3)
        result = client.infer_frame("ensemble", frame)

        assert result.index.equals(frame.index)
        one = client.infer("ensemble", frame.head(3)).as_pandas()
        assert list(result.columns) == list(one.columns) == ["predictions"]
        assert result["predictions"].dtype == one["predictions"].dtype
        expected, clear = _reference_predictions(frame)
        assert clear.mean() > 0.99 and set(expected[clear]) == {0.0, 1.0}  # both answers are there to get right
        np.testing.assert_array_equal(result["predictions"].to_numpy()[clear], expected[clear])
        # row by row at the pieces' edges, as one-row requests see them
        for position in (0, limit - 1, limit, 2 * limit - 1, 2 * limit, len(frame) - 1):
            alone = client.infer("ensemble", frame.iloc[[position]]).as_numpy("predictions")[0]
            assert result["predictions"].iloc[position] == alone, position

        stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
        # three ensemble requests (the frame) and the seven checks above; pieces of 4096, 4096 and 2048 rows
        assert stats["ensemble"]["inference_stats"]["success"]["count"] == 3 + 7
        batches = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["fil"]["batch_stats"]}
        assert batches[limit] == 2 and batches[limit // 2] == 1


def test_infer_keeps_refusing_a_batch_over_max_batch_size():
    with triton_nb.serve(ROOT / "model_repository") as server:
        client = server.client()
        frame = fraud.generate_transactions(4097, seed=12)
        with pytest.raises(InvalidArgumentError, match=r"batch-size must be <= 4096 for 'ensemble'"):
            client.infer("ensemble", frame)
        assert len(client.infer_frame("ensemble", frame)) == 4097  # what infer_frame is for


def test_pieces_are_in_flight_together(gated):
    server, folder = gated
    frame = _xs(np.arange(20), index=[f"r{i}" for i in range(20)])  # pieces of 8, 8 and 4 rows
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(server.client().infer_frame, "gated", frame)
        try:
            # the first piece is held in the model; the other two can only be queued behind it if
            # infer_frame sent them without waiting for the first
            _until(lambda: (folder / "running").exists() and server.queue_depth("gated") == 2,
                   "the first piece executing and the other two queued")
            assert server.pending_requests == 3 and not answer.done()
        finally:
            (folder / "open").touch()
        result = answer.result(timeout=60)
    assert result.index.tolist() == frame.index.tolist()
    np.testing.assert_array_equal(result["Y"].to_numpy(), np.arange(20, dtype=np.float32) * 2)


def test_max_in_flight_bounds_the_pieces_in_flight(gated, monkeypatch):
    server, folder = gated
    sent = []
    busy_at_send = []
    original = server.infer_async

    def recording(request):
        busy_at_send.append(sum(not f.done() for f in sent))
        future = original(request)
        sent.append(future)
        return future

    monkeypatch.setattr(server, "infer_async", recording)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(server.client().infer_frame, "gated", _xs(np.arange(20)), max_in_flight=1)
        try:
            _until(lambda: (folder / "running").exists(), "the first piece executing")
            assert len(sent) == 1 and server.queue_depth("gated") == 0  # the second waits for the first
        finally:
            (folder / "open").touch()
        result = answer.result(timeout=60)
    assert len(sent) == 3 and busy_at_send == [0, 0, 0]
    np.testing.assert_array_equal(result["Y"].to_numpy(), np.arange(20, dtype=np.float32) * 2)


def test_a_failed_piece_names_its_rows_after_all_pieces_ran(small):
    client = small.client()
    before = _counts(small, "double")
    values = np.arange(10, dtype=np.float32)
    values[[1, 9]] = np.nan  # in the pieces of rows 0-3 and 8-9; rows 4-7 are fine
    with pytest.raises(InvalidArgumentError) as caught:
        client.infer_frame("double", _xs(values))
    message = str(caught.value)
    assert message.startswith("model 'double': 2 of 3 request(s)")
    assert "rows 0-3, rows 8-9: X has NaN" in message and "rows 4-7" not in message
    # every piece was run, the good one included, before the error came
    _until(lambda: _counts(small, "double") == (before[0] + 1, before[1] + 2), "one success and two failures")

    # a value that cannot become the input's datatype fails its own piece, before it is sent
    bad = pd.DataFrame({"X": [0.0, np.nan, 2.0, 3.0, 4.0, "twelve", 6.0, 7.0, 8.0]}, dtype=object)
    with pytest.raises(InvalidArgumentError) as caught:
        client.infer_frame("double", bad)
    message = str(caught.value)
    assert "2 of 3 request(s)" in message and "rows 0-3: X has NaN" in message
    assert "rows 4-7: model 'double': column 'X' cannot become FP32" in message and "row 8" not in message


def test_bad_frames_are_refused_before_anything_is_sent(small):
    client = small.client()
    before = _counts(small, "double")
    cases = [
        (lambda: client.infer_frame("double", _xs([])), InvalidArgumentError, r"model 'double': .*no rows"),
        (lambda: client.infer_frame("double", {"X": np.ones((2, 1), np.float32)}), InvalidArgumentError,
         r"model 'double': infer_frame takes a pandas DataFrame, got dict"),
        (lambda: client.infer_frame("double", pd.DataFrame({"W": [1.0]})), InvalidArgumentError,
         r"model 'double': the DataFrame has no column\(s\) 'X'"),
        (lambda: client.infer_frame("double", _xs([1]), output=["Y"]), TypeError,
         r"unexpected keyword argument 'output'"),
        (lambda: client.infer_frame("double", _xs([1]), max_in_flight=0), InvalidArgumentError,
         r"model 'double': max_in_flight must be a whole number >= 1"),
        (lambda: client.infer_frame("doubel", _xs([1])), NotFoundError, r"'doubel' is not found"),
        (lambda: client.infer_frame("pair", _xs([1, 2])), InvalidArgumentError,
         r"model 'pair' does not batch \(max_batch_size 0\).*input 'X' takes 2 values per request \(dims \[2\]\)"),
    ]
    for call, kind, pattern in cases:
        with pytest.raises(kind, match=pattern):
            call()
    assert _counts(small, "double") == before and _counts(small, "pair") == (0, 0)


def test_a_model_without_batching_gets_a_request_per_row(small):
    before = _counts(small, "single")
    frame = _xs([1, 2, 3, 4, 5], index=pd.Index([50, 40, 30, 20, 10], name="id"))
    result = small.client().infer_frame("single", frame)
    assert result.index.equals(frame.index) and list(result.columns) == ["Y"]
    np.testing.assert_array_equal(result["Y"].to_numpy(), np.array([3, 6, 9, 12, 15], np.float32))
    assert _counts(small, "single") == (before[0] + 5, before[1])


def test_options_reach_every_piece(small, monkeypatch):
    client = small.client()
    frame = _xs(np.arange(10))
    # model_version and outputs, by their effect
    np.testing.assert_array_equal(client.infer_frame("double", frame)["Y"].to_numpy(), np.arange(10) * 2)
    np.testing.assert_array_equal(client.infer_frame("double", frame, model_version=1)["Y"].to_numpy(),
                                  np.arange(10))
    only_z = client.infer_frame("double", frame, outputs=["Z"])
    assert list(only_z.columns) == ["Z"]
    np.testing.assert_array_equal(only_z["Z"].to_numpy(), np.arange(10) + 1)
    # priority, by the scheduler's refusal of a level the model does not have, for every piece
    with pytest.raises(InvalidArgumentError, match=r"3 of 3 request\(s\).*rows 0-3, rows 4-7, rows 8-9: .*"
                                                   r"priority 3 is outside 1\.\.2"):
        client.infer_frame("double", frame, priority=3)
    # and all of them, as the requests carry them
    requests = []
    original = small.infer_async
    monkeypatch.setattr(small, "infer_async", lambda request: requests.append(request) or original(request))
    client.infer_frame("double", frame, outputs=["Y"], model_version="2", request_id="batch-7", priority=2,
                       timeout_microseconds=60_000_000, parameters={"tag": "x"})
    assert [r.batch_size(True) for r in requests] == [4, 4, 2]
    for request in requests:
        assert (request.requested_outputs, request.model_version, request.request_id, request.priority,
                request.timeout_microseconds, request.parameters) == (["Y"], 2, "batch-7", 2, 60_000_000, {"tag": "x"})


def test_the_limit_in_force_splits_the_frame(small):
    small.update_batching("double", max_batch_size=3)
    try:
        frame = _xs(np.arange(7))
        before = _counts(small, "double")
        result = small.client().infer_frame("double", frame)
        np.testing.assert_array_equal(result["Y"].to_numpy(), np.arange(7) * 2)
        assert _counts(small, "double") == (before[0] + 3, before[1])  # 3 + 3 + 1 rows
    finally:
        small.update_batching("double", max_batch_size=4)


def test_a_piece_not_answered_in_time_fails(gated):
    server, _folder = gated
    # the gate stays shut: no piece can be answered, so each one's wait runs out
    with pytest.raises(UnavailableError, match=r"model 'gated': 3 of 3 request\(s\).*rows 0-7, rows 8-15, "
                                               r"rows 16-19: model 'gated': no response within 0\.2 s"):
        server.client().infer_frame("gated", _xs(np.arange(20)), timeout_microseconds=200_000)


def test_ainfer_wakes_the_loop_once_per_finished_batch_not_per_request(gated):
    import asyncio

    from triton_nb.client import _relay

    server, folder = gated
    client = server.client()

    async def main():
        first = asyncio.ensure_future(client.ainfer("gated", _xs(np.array([0.0]))))
        await asyncio.to_thread(_until, lambda: (folder / "running").exists(), "the first batch started")
        rest = [asyncio.ensure_future(client.ainfer("gated", _xs(np.array([float(i)])))) for i in range(1, 9)]
        await asyncio.to_thread(_until, lambda: server.queue_depth("gated") == 8, "8 requests queued behind it")
        relay = _relay(asyncio.get_running_loop())
        before = relay.wakeups
        (folder / "open").touch()  # the first batch (1 request) ends, then the 8 queued leave as one batch
        results = await asyncio.wait_for(asyncio.gather(first, *rest), 30)
        return [r.as_numpy("Y").ravel().tolist() for r in results], relay.wakeups - before

    answers, wakeups = asyncio.run(main())
    assert answers == [[2.0 * i] for i in range(9)]
    assert wakeups <= 2  # one hand-over per finished batch, where wrap_future would wake it 9 times


def test_a_cancelled_ainfer_cancels_its_request(gated):
    import asyncio

    server, folder = gated
    client = server.client()

    async def main():
        first = asyncio.ensure_future(client.ainfer("gated", _xs(np.array([1.0]))))
        await asyncio.to_thread(_until, lambda: (folder / "running").exists(), "the first batch started")
        queued = asyncio.ensure_future(client.ainfer("gated", _xs(np.array([2.0]))))
        await asyncio.to_thread(_until, lambda: server.queue_depth("gated") == 1, "a request queued")
        queued.cancel()
        await asyncio.sleep(0)
        (folder / "open").touch()
        result = await asyncio.wait_for(first, 30)
        return result.as_numpy("Y").ravel().tolist(), queued.cancelled()

    assert asyncio.run(main()) == ([2.0], True)
    _until(lambda: server.statistics("gated")["model_stats"][0]["inference_stats"]["fail"]["count"] == 1,
           "the cancelled request counted as failed")


def test_async_infer_and_ainfer_take_infers_keywords_and_refuse_a_misspelt_one(small):
    client = small.client()
    frame = _xs([1.0, 2.0])
    pending = client.async_infer("double", frame, outputs=["Y"], model_version="1", request_id="r-1")
    result = pending.get_result(timeout=30)
    assert result.get_response()["id"] == "r-1" and result.get_response()["model_version"] == "1"
    with pytest.raises(TypeError, match="model_versoin"):
        client.async_infer("double", frame, model_versoin="1")  # before, silently ignored
    answer = asyncio.run(client.ainfer("double", frame, request_id="r-2"))
    assert answer.get_response()["id"] == "r-2"
    with pytest.raises(TypeError, match="request_ide"):
        asyncio.run(client.ainfer("double", frame, request_ide="r-3"))
