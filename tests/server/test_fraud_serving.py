"""The exported fraud repository served in-process: predictions equal XGBoost's."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from triton_nb import fraud, serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.repository import BatchingOptions, export_fraud_repository


@pytest.fixture(scope="module")
def frame():
    return fraud.generate_transactions(6000, seed=3, fraud_rate=0.05)


@pytest.fixture(scope="module")
def trained(frame):
    return fraud.train_fraud_model(frame, num_boost_round=20, early_stopping_rounds=None, progress=False, nthread=2)


@pytest.mark.parametrize("model_backend", ["fil", "python", "onnxruntime"])
def test_raw_dataframe_into_the_ensemble(trained, frame, tmp_path, model_backend):
    root = export_fraud_repository(trained, tmp_path / "repo", model_backend=model_backend)
    rows = frame.sample(300, random_state=1)
    expected = trained.predict(rows)
    proba = trained.predict_proba(rows)[:, 1]
    clear = np.abs(proba - trained.threshold) > 1e-4  # ONNX computes in float32
    with serve(root) as server:
        client = server.client()
        result = client.infer("ensemble", rows)  # a raw TabFormer DataFrame just works
        got = result.as_numpy("predictions")
        # FIL (and its Python twin) squeeze dims [1] to [rows]; ONNX Runtime answers the graph's [rows, 1]
        assert got.shape == ((len(rows), 1) if model_backend == "onnxruntime" else (len(rows),))
        np.testing.assert_array_equal(got.reshape(-1)[clear], expected[clear])
        assert list(result.as_pandas().columns) == ["predictions"]
        features = client.infer("preprocessing", rows.head(20)).as_numpy("OUTPUT")
        np.testing.assert_array_equal(features, trained.features(rows.head(20)))


def test_single_rows_batch_across_ensemble_requests(trained, frame, tmp_path):
    batching = BatchingOptions(max_queue_delay_microseconds=20_000)
    root = export_fraud_repository(trained, tmp_path / "repo", batching=batching, predict_proba=True)
    rows = frame.head(120)
    with serve(root) as server:
        client = server.client()
        with ThreadPoolExecutor(24) as pool:
            got = list(pool.map(lambda i: client.infer("ensemble", rows.iloc[i:i + 1]).as_numpy("predictions")[0],
                                range(len(rows))))
        np.testing.assert_allclose(got, trained.predict_proba(rows)[:, 1], rtol=1e-5)  # FIL sums in float32
        stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
        assert stats["ensemble"]["inference_stats"]["success"]["count"] == 120
        assert stats["fil"]["execution_count"] < 120  # the composing models' batchers batched them
        assert stats["preprocessing"]["execution_count"] < 120


def test_awaitable_and_bad_rows(trained, frame, tmp_path):
    root = export_fraud_repository(trained, tmp_path / "repo")
    with serve(root) as server:
        client = server.client()
        # rows of both answers, none so near the threshold that FIL's float32 sum could decide it
        proba = trained.predict_proba(frame)[:, 1]
        clear = np.abs(proba - trained.threshold) > 1e-4
        fraud_rows = np.flatnonzero(clear & (proba > trained.threshold))[:4]
        other_rows = np.flatnonzero(clear & (proba <= trained.threshold))[:6]
        assert len(fraud_rows) == 4 and len(other_rows) == 6
        rows = frame.iloc[np.sort(np.concatenate([fraud_rows, other_rows]))]
        result = asyncio.run(client.ainfer("ensemble", rows))
        got = result.as_numpy("predictions")
        assert got.shape == (10,)  # FIL squeezes dims [1]
        np.testing.assert_array_equal(got, trained.predict(rows))
        bad = frame.head(3).copy()
        bad["Amount"] = bad["Amount"].astype(object)
        bad.loc[bad.index[1], "Amount"] = "twelve"
        with pytest.raises(InvalidArgumentError, match=r"ensemble 'ensemble', step 0.*'Amount'.*twelve"):
            client.infer("ensemble", bad)
        with pytest.raises(InvalidArgumentError, match="no column\\(s\\) 'MCC'"):
            client.infer("ensemble", frame.head(2).drop(columns=["MCC"]))
        # the refusals left the server serving, with the same answers
        after = client.infer("ensemble", rows).as_numpy("predictions")
        np.testing.assert_array_equal(after, got)


def _carried_groups(monkeypatch) -> list[tuple[int, ...]]:
    """The rows of every carried request the server is handed (an ensemble step's request that
    carries several ensemble requests), whichever road of the ensemble scheduler made it."""
    from triton_nb.server.core import Server

    groups: list[tuple[int, ...]] = []
    infer_step = Server._infer_step

    def spy(self, request, *args, **kwargs):
        if request.carried_rows:
            groups.append(request.carried_rows)
        return infer_step(self, request, *args, **kwargs)

    monkeypatch.setattr(Server, "_infer_step", spy)
    return groups


@pytest.mark.parametrize("tree_batching", [True, False])
def test_the_tree_step_takes_a_formed_batch_as_one_request(trained, frame, tmp_path, monkeypatch, tree_batching):
    """Preprocessing's batches go on into the FIL model whole when it batches dynamically (and
    one by one when it does not); the answers and every request count stay what they were."""
    groups = _carried_groups(monkeypatch)
    batching = BatchingOptions(max_queue_delay_microseconds=20_000)
    root = export_fraud_repository(trained, tmp_path / "repo", batching=batching, predict_proba=True)
    sizes = [1 + i % 3 for i in range(30)]  # requests of 1, 2 and 3 rows: 60
    rows = frame.tail(60)
    starts = np.cumsum([0, *sizes[:-1]])
    with serve(root) as server:
        if not tree_batching:
            server.update_batching("fil", dynamic_batching=False)
        client = server.client()

        async def all_at_once():
            return await asyncio.gather(*(client.ainfer("ensemble", rows.iloc[s:s + n])
                                          for s, n in zip(starts, sizes, strict=True)))

        results = asyncio.run(all_at_once())
        stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    got = np.concatenate([r.as_numpy("predictions") for r in results])
    np.testing.assert_allclose(got, trained.predict_proba(rows)[:, 1], rtol=1e-5)
    for name in ("ensemble", "preprocessing", "fil"):
        assert stats[name]["inference_stats"]["success"]["count"] == 30, name  # requests, carried or not
        assert stats[name]["inference_count"] == 60, name
    if tree_batching:
        assert groups and all(len(g) > 1 for g in groups) and sum(map(sum, groups)) <= 60
        assert stats["fil"]["execution_count"] <= stats["preprocessing"]["execution_count"]
    else:
        assert groups == []  # Triton's default scheduler runs each request alone: nothing carried
        assert stats["fil"]["execution_count"] == 30
