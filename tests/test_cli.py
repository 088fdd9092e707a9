"""The triton-nb command: train, generate, demo, and one-line errors."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from triton_nb.cli import _build_parser, main
from triton_nb.fraud import TABFORMER_COLUMNS, TrainedFraudModel, load_tabformer_csv


def test_train_writes_model_encoders_and_metrics(tmp_path, capsys):
    out = tmp_path / "model"
    assert main(["train", "--rows", "6000", "--rounds", "20", "--out", str(out), "--fraud-rate", "0.05"]) == 0
    printed = capsys.readouterr().out
    assert "AUC-PR" in printed
    for name in ("xgboost.json", "xgboost.ubj", "label_encoders.pkl", "label_encoders.json", "metrics.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "metrics.json").read_text())
    assert 0.0 < summary["metrics"]["aucpr"] <= 1.0
    assert summary["num_trees"] <= 20
    assert TrainedFraudModel.load(out).predict_proba(
        load_tabformer_csv(_csv(tmp_path)).head(3)
    ).shape == (3, 2)


def _csv(tmp_path):
    path = tmp_path / "tx.csv"
    assert main(["generate", "--rows", "3000", "--out", str(path), "--fraud-rate", "0.05"]) == 0
    return path


def test_generate_then_train_on_the_csv(tmp_path, capsys):
    path = _csv(tmp_path)
    header = path.read_text(encoding="utf-8").splitlines()[0]
    assert header.split(",")[:3] == list(TABFORMER_COLUMNS[:3])
    assert len(pd.read_csv(path)) == 3000
    out = tmp_path / "m"
    assert main(["train", "--csv", str(path), "--rows", "2500", "--rounds", "5", "--out", str(out)]) == 0
    assert "2,500 rows" in capsys.readouterr().out


def test_user_errors_are_one_line_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "triton_nb.cli", "train", "--csv", str(tmp_path / "missing.csv"),
         "--out", str(tmp_path / "o")],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "missing.csv" in result.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "triton_nb.cli", "train", "--rows", "-5", "--out", str(tmp_path)],
        capture_output=True, text=True, check=False,
    )
    assert bad.returncode == 2 and "--rows" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_the_demo_trains_serves_over_every_protocol_sweeps_and_reports(tmp_path, capfd, monkeypatch):
    # a cache of its own: the FIL model is compiled here, which is when tl2cgen logs
    monkeypatch.setenv("TRITON_NB_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    assert main(["demo", "--rows", "5000", "--rounds", "10", "--out", str(out), "--measurement-interval", "150"]) == 0
    printed, errors = capfd.readouterr()  # file descriptors, so C++ output would be caught too
    assert "demo finished" in printed
    # no Treelite/TL2cgen log lines ("[09:01:02] /src/split.cc:35: ...") on the console
    assert not re.search(r"\.cc:\d+:", printed + errors), printed + errors
    assert any((tmp_path / "cache").rglob("*.so")), "the tree model was not compiled: the check above saw nothing"
    for path in ("in-process: 2,000", "http: 256", "grpc: 256"):
        assert f"{path} transactions, 100.0% agree with XGBoost" in printed
    assert (out / "model" / "xgboost.json").is_file() and (out / "model_repository" / "ensemble").is_dir()
    report = out / "report"
    for name in ("summary.md", "sweep_measurements.csv", "sweep_ranking.csv", "perf_analyzer_best_config.csv",
                 "throughput_vs_latency.png", "knob_heatmap.png", "latency_breakdown.png", "batch_sizes.png",
                 "payload.png", "payload_measurements.csv"):
        assert (report / name).stat().st_size > 0, name
    ranking = (report / "sweep_ranking.csv").read_text().splitlines()
    assert len(ranking) == 1 + 6 + 1  # 3 delays x 2 instance counts, and dynamic batching off
    assert any(",dynamic batching off," in line for line in ranking)
    summary = (report / "summary.md").read_text()
    assert "Recommended:" in summary
    gain = re.search(r"^dynamic batching gain: (\d+\.\d)x", summary, re.MULTILINE)
    assert gain, summary  # the line is there and says a number, measured in this run
    assert gain.group(0) in printed
    # the payload's trade-off, measured in this run: each payload at 1 and 16 in flight, with its bytes
    section = summary[summary.index("## Payload"):]
    rows = [line.split(" | ") for line in section.splitlines() if re.match(r"^\| (binary|json)", line)]
    assert [(row[0].strip("| "), row[1]) for row in rows] == [
        (payload, level) for payload in ("binary", "json", "binary + gzip") for level in ("1", "16")]
    sizes = {row[0].strip("| "): float(row[5]) for row in rows}
    assert all(float(row[2]) > 0 and float(row[5]) > 0 and float(row[6]) > 0 for row in rows), section
    assert sizes["binary + gzip"] < sizes["binary"] and sizes["json"] != sizes["binary"]
    assert "![payload](payload.png)" in section and "| binary + gzip | 16 |" in printed


def test_export_and_validate(tmp_path, capsys):
    out = tmp_path / "repo"
    assert main(["export", "--model-repository", str(out), "--rows", "4000", "--rounds", "5", "--model-backend",
                 "python", "--predict-proba", "--max-batch-size", "64", "--instance-count", "2",
                 "--preferred-batch-size", "8,16"]) == 0
    assert (out / "fil" / "1" / "model.py").is_file()
    from triton_nb.repository import load_config

    assert list(load_config(out / "fil" / "config.pbtxt").dynamic_batching.preferred_batch_size) == [8, 16]
    assert capsys.readouterr().err == ""  # the current spellings: no deprecation line
    assert main(["validate", "--model-repository", str(out)]) == 0
    assert "0 error(s)" in capsys.readouterr().out
    (out / "fil" / "1" / "model.py").unlink()
    (out / "ensemble" / "config.pbtxt").write_text(
        (out / "ensemble" / "config.pbtxt").read_text().replace('model_name: "fil"', 'model_name: "trees"')
    )
    assert main(["validate", "--model-repository", str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "error: model 'fil': 1/model.py: missing" in "\n".join(lines)
    assert any(line.startswith("error: model 'ensemble': config.pbtxt: ensemble_scheduling.step[1].model_name")
               for line in lines)
    assert any("ensemble output 'predictions' is not written" in line for line in lines)
    assert lines[-1].endswith("3 error(s), 0 warning(s)")


def test_export_refuses_an_existing_repository(tmp_path, capsys):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "x").write_text("x")
    assert main(["export", "--model-repository", str(tmp_path / "repo"), "--rows", "3000", "--rounds", "2"]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["validate", "--model-repository", str(tmp_path / "nowhere")]) == 2
    assert "nowhere does not exist" in capsys.readouterr().err


# --------------------------------------------------------------------------- one spelling per idea
def test_the_earlier_repository_spellings_still_work_for_a_release_with_a_line_naming_the_new_one(tmp_path, capsys):
    # export --out DIR (now --model-repository DIR): the same command, one deprecation line first
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "x").write_text("x")
    assert main(["export", "--out", str(tmp_path / "repo"), "--rows", "3000", "--rounds", "2"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert errors[0] == "triton-nb export: --out is deprecated: use --model-repository"
    assert "exists and is not empty" in errors[-1]
    # validate DIR (now validate --model-repository DIR)
    assert main(["validate", str(tmp_path / "nowhere")]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert errors[0] == ("triton-nb validate: 'triton-nb validate DIR' is deprecated: "
                         "use 'triton-nb validate --model-repository DIR'")
    assert "nowhere does not exist" in errors[-1]


@pytest.mark.parametrize("argv", [
    ["export", "--out", "a", "--model-repository", "b"],
    ["validate", "a", "--model-repository", "b"],
])
def test_an_old_and_a_new_spelling_together_are_one_line_errors(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--model-repository: not allowed with" in error


@pytest.mark.parametrize("command", ["export", "validate"])
def test_a_missing_repository_is_named_by_its_flag(command, capsys):
    with pytest.raises(SystemExit):
        main([command])
    assert capsys.readouterr().err == (f"triton-nb {command}: error: the following arguments are required: "
                                       f"--model-repository (see triton-nb {command} --help)\n")


@pytest.mark.parametrize(("argv", "repository"), [
    (["export", "--model-repository", "r"], Path("r")),
    (["validate", "--model-repository", "r"], Path("r")),
    (["serve", "--model-repository", "r"], [Path("r")]),  # tritonserver's flag, which repeats there
    (["serve", "--model-store", "r"], [Path("r")]),  # tritonserver's other spelling
    (["perf", "-m", "m", "--model-repository", "r", "--concurrency-range", "1"], Path("r")),
    (["tune", "-m", "m", "--model-repository", "r", "--latency-budget-ms", "5", "--instance-count", "1"], Path("r")),
])
def test_every_command_that_takes_a_repository_takes_it_as_model_repository(argv, repository):
    args = _build_parser().parse_args(argv)
    if hasattr(args, "check") and argv[0] in ("export", "validate"):
        args.check(args)
    assert args.model_repository == repository


def test_lists_are_comma_separated_and_the_earlier_space_separated_form_still_reads(capsys):
    def preferred(*values: str) -> list[int]:
        return _build_parser().parse_args(["export", "--model-repository", "r", "--preferred-batch-size",
                                           *values]).preferred_batch_size

    assert preferred("8,16") == [8, 16] and preferred("8") == [8] and preferred() == []
    assert capsys.readouterr().err == ""
    assert preferred("8", "16") == [8, 16]  # the spelling before: read, with a line giving the new one
    assert capsys.readouterr().err == (
        "triton-nb export: --preferred-batch-size 8 16 is deprecated: use --preferred-batch-size 8,16\n")
    args = _build_parser().parse_args(["tune", "-m", "m", "-u", "h:1", "--latency-budget-ms", "5",
                                       "--instance-count", "1,2", "-b", "1,8", "--batch-size-weights", "3,1"])
    assert (args.instance_count, args.rows_per_request, args.batch_size_weights) == ([1, 2], [1, 8], [3.0, 1.0])


@pytest.mark.parametrize(("argv", "message"), [
    (["export", "--model-repository", "r", "--preferred-batch-size", "8,x"],
     "argument --preferred-batch-size: expected comma-separated whole numbers, got '8,x'"),
    (["export", "--model-repository", "r", "--preferred-batch-size", "0,8"],
     "argument --preferred-batch-size: expected values >= 1, got 0"),
    (["tune", "-m", "m", "-u", "h:1", "--latency-budget-ms", "5", "--instance-count", "1,1"],
     "argument --instance-count: repeated value in '1,1'"),
    (["perf", "-m", "m", "-u", "h:1", "--concurrency-range", "1", "-b", "1,4", "--batch-size-weights", "1,inf"],
     "argument --batch-size-weights: expected finite numbers, got '1,inf'"),
])
def test_a_bad_list_is_a_one_line_error_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1


def test_no_flag_takes_space_separated_values_but_the_one_kept_for_a_release():
    from triton_nb.cli._args import SpacedListAlias

    parser = _build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    spaced = [(name, action.option_strings[0]) for name, sub in commands.choices.items() for action in sub._actions
              if action.nargs in ("*", "+") and not isinstance(action, SpacedListAlias)]
    assert spaced == []


@pytest.mark.parametrize("command", ["train", "export", "demo"])
def test_device_takes_its_values_only(command, capsys):
    args = _build_parser().parse_args([command, "--out" if command != "export" else "--model-repository", "x",
                                       "--device", "cuda:1"])
    assert args.device == "cuda:1"
    with pytest.raises(SystemExit):
        main([command, "--device", "gpu"])
    error = capsys.readouterr().err
    assert "argument --device: expected auto, cpu, cuda or cuda:N, got 'gpu'" in error and error.count("\n") == 1


def test_device_cuda_without_a_cuda_device_is_one_line_before_any_work(monkeypatch, tmp_path, capsys):
    import triton_nb._optional

    monkeypatch.setattr(triton_nb._optional, "xgboost_cuda_available", lambda: False)
    with pytest.raises(SystemExit) as exited:
        main(["train", "--out", str(tmp_path / "m"), "--device", "cuda"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "triton-nb train: error: --device cuda: no usable CUDA device (none is visible, or this XGBoost build has "
        "no CUDA support); use --device auto or --device cpu (see triton-nb train --help)\n")
    assert not (tmp_path / "m").exists()  # nothing generated or trained
    # with a CUDA device the check passes; an export from a trained model reads no --device
    monkeypatch.setattr(triton_nb._optional, "xgboost_cuda_available", lambda: True)
    args = _build_parser().parse_args(["train", "--out", "m", "--device", "cuda"])
    args.check(args)
    monkeypatch.setattr(triton_nb._optional, "xgboost_cuda_available", lambda: False)
    args = _build_parser().parse_args(["export", "--model-repository", "r", "--from-model", "m", "--device", "cuda"])
    args.check(args)
