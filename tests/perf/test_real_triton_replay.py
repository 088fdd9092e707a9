"""replay against the real tritonserver: a small sweep in the kernel over a Python-backend model
with dynamic batching, its top configs replayed on real Triton (explicit model control, config
overrides through the repository load API), from the API and from ``triton-nb tune --replay-url``;
real Triton's config is read back afterwards. No timing is asserted."""

from __future__ import annotations

import pytest
import tritonclient.http as httpclient

from tests.helpers.real_triton import RealTritonServer, tritonserver_unavailable_reason
from tests.helpers.scale_models import write_scale_model
from triton_nb import serve
from triton_nb.cli import main
from triton_nb.perf import replay, tune

pytestmark = [pytest.mark.real_triton, pytest.mark.slow]

ORIGINAL_DELAY_US = 2000  # write_scale_model's; none of the swept values, so a restore is visible
DELAYS_US = [0, 100, 500]
SMALL = {"concurrency_range": [1, 4], "measurement_interval_ms": 200, "max_trials": 2, "progress": False,
         "input_data": "zero"}


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    reason = tritonserver_unavailable_reason()
    if reason is not None:
        pytest.fail(f"real Triton cannot run here: {reason}")
    repo = tmp_path_factory.mktemp("repo")
    write_scale_model(repo, extra=f"dynamic_batching {{ max_queue_delay_microseconds: {ORIGINAL_DELAY_US} }}")
    with RealTritonServer(repo, extra_args=["--model-control-mode=explicit", "--load-model=*"]) as server:
        yield server, repo


def _real_delay_us(url: str) -> int:
    config = httpclient.InferenceServerClient(url).get_model_config("scale")
    return int(config["dynamic_batching"]["max_queue_delay_microseconds"])


def test_the_sweeps_top_configs_replayed_on_real_triton(triton):
    server, repo = triton
    with serve(repo) as kernel:
        swept = tune(kernel, "scale", {"max_queue_delay_microseconds": DELAYS_US}, **SMALL)
    assert swept.recommended is not None
    outcome = replay(swept, server.http_url, top=2, rounds=2, progress=False)
    table = outcome.comparison
    replayed = list(swept.ranking["config"].head(2))
    assert list(table["config"]) == replayed, server.log_tail()
    assert table["sweep_rank"].tolist() == [1, 2] and sorted(table["triton_rank"]) == [1, 2]
    assert (table["triton_throughput_infer_per_sec"] > 0).all() and (table["sweep_throughput_infer_per_sec"] > 0).all()
    assert set(outcome.measurements["round"]) == {1, 2} and (outcome.measurements["errors"] == 0).all()
    assert 0 < outcome.pick_vs_best <= 1
    ours = table.loc[table["recommended"], "triton_throughput_infer_per_sec"].iloc[0]
    assert outcome.pick_vs_best == pytest.approx(ours / table["triton_throughput_infer_per_sec"].max())
    assert _real_delay_us(server.http_url) == ORIGINAL_DELAY_US  # real Triton's own config is back


def test_tune_replay_url_prints_both_rankings_and_the_figure(triton, capsys):
    server, repo = triton
    status = main(["tune", "-m", "scale", "--model-repository", str(repo), "--latency-budget-ms", "1000",
                   "--max-queue-delay-microseconds", "0,500", "--concurrency-range", "1:4:3", "-p", "200",
                   "-r", "2", "--input-data", "zero", "--replay-url", server.grpc_url, "-i", "grpc",
                   "--replay-top", "2", "--replay-rounds", "1"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "Triton rank" in out and "(our pick)" in out and "round 1: delay_us=" in out
    assert f"real Triton at {server.grpc_url} gives our pick" in out
    assert _real_delay_us(server.http_url) == ORIGINAL_DELAY_US


def test_a_model_real_triton_lacks_fails_before_the_sweep(triton, capsys, tmp_path):
    server, _ = triton
    write_scale_model(tmp_path, name="other")
    status = main(["tune", "-m", "other", "--model-repository", str(tmp_path), "--latency-budget-ms", "1000",
                   "--max-queue-delay-microseconds", "0", "--replay-url", server.http_url])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.startswith(f"triton-nb tune: error: replay on {server.http_url}: no model 'other'")
    assert "\n" not in err


def test_replay_starts_tritonserver_over_the_python_twin_of_the_served_repository(tmp_path):
    """url=None: the wheel's tritonserver is started over the committed fraud repository, its FIL
    model served by the Python twin, and stopped at the end."""
    from pathlib import Path

    from triton_nb.tritonserver import TritonServerProcess

    reason = tritonserver_unavailable_reason()
    if reason is not None:
        pytest.fail(f"real Triton cannot run here: {reason}")
    repository = Path(__file__).resolve().parents[2] / "model_repository"
    started: list[TritonServerProcess] = []
    original_start = TritonServerProcess.start

    def recording_start(self):
        started.append(self)
        original_start(self)

    with serve(repository) as kernel:
        swept = tune(kernel, "ensemble", {"max_queue_delay_microseconds": [0, 500]}, tuned_model="fil",
                     **{**SMALL, "input_data": "fraud"})
    assert swept.recommended is not None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TritonServerProcess, "start", recording_start)
        outcome = replay(swept, top=2, rounds=1, progress=False, model_repository=repository)
    assert len(started) == 1 and started[0].pid is None  # started for the replay, stopped after it
    assert (outcome.measurements["errors"] == 0).all()
    assert (outcome.comparison["triton_throughput_infer_per_sec"] > 0).all()
    assert 0 < outcome.pick_vs_best <= 1
    assert any("Python twin" in note for note in outcome.notes)
    assert outcome.summary().startswith("real Triton at the tritonserver started for the replay gives our pick")


def test_replay_without_url_or_repository_says_what_to_give(tmp_path):
    write_scale_model(tmp_path)
    with serve(tmp_path) as kernel:
        swept = tune(kernel, "scale", {"max_queue_delay_microseconds": [0]}, **SMALL)
    with pytest.raises(ValueError, match=r"give url= .* or model_repository="):
        replay(swept, progress=False)
    with pytest.raises(ValueError, match="is for a tritonserver started here"):
        replay(swept, "127.0.0.1:1", model_repository=tmp_path, progress=False)


def test_tune_replay_url_start_starts_and_stops_tritonserver(tmp_path, capsys):
    write_scale_model(tmp_path, extra=f"dynamic_batching {{ max_queue_delay_microseconds: {ORIGINAL_DELAY_US} }}")
    status = main(["tune", "-m", "scale", "--model-repository", str(tmp_path), "--latency-budget-ms", "1000",
                   "--max-queue-delay-microseconds", "0,500", "--concurrency-range", "1:4:3", "-p", "200",
                   "-r", "2", "--input-data", "zero", "--replay-url", "start", "--replay-top", "2",
                   "--replay-rounds", "1"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "on a tritonserver started over the Python twin of the repository" in out
    assert "Triton rank" in out and "(our pick)" in out and "gives our pick" in out


def test_tune_replay_url_start_without_a_repository_fails_before_the_sweep(capsys):
    status = main(["tune", "-m", "scale", "-u", "127.0.0.1:1", "--max-queue-delay-microseconds", "0",
                   "--latency-budget-ms", "1000",
                   "--replay-url", "start"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "--replay-url start starts tritonserver over --model-repository" in err
    assert "\n" not in err
