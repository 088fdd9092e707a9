"""Warm-up samples in the repository: Triton's data layout, static validation, and the fraud export."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb import fraud, serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.repository import export_fraud_repository, load_config, validate_repository
from triton_nb.repository.export import WARMUP_TRANSACTION
from triton_nb.repository.validate import errors_only
from triton_nb.repository.warmup import (
    check_warmup,
    decode_bytes_elements,
    encode_bytes_elements,
    warmup_samples,
)

# --------------------------------------------------------------------------- the BYTES layout


def test_bytes_elements_are_length_prefixed_little_endian():
    data = encode_bytes_elements(np.array([b"ab", "é", b""], dtype=object))
    assert data == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 2) + "é".encode() + struct.pack("<I", 0)
    assert decode_bytes_elements(data) == [b"ab", "é".encode(), b""]
    assert decode_bytes_elements(b"") == []


@pytest.mark.parametrize("data, words", [(b"\x05\0\0\0ab", "declares 5 bytes"), (b"\x01\0", "too few")])
def test_a_cut_short_bytes_layout_is_refused(data, words):
    with pytest.raises(InvalidArgumentError, match=words):
        decode_bytes_elements(data)


# --------------------------------------------------------------------------- static checks

CONFIG = """
name: "m"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 3 ] }}, {{ name: "S" data_type: TYPE_STRING dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }} ]
model_warmup [ {samples} ]
"""
GOOD_X = 'inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } }'
GOOD_S = 'inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] random_data: true } }'
FILE_X = 'inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "x.bin" } }'
ABSENT_X = 'inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "no.bin" } }'
FILE_S = 'inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "s.bin" } }'
PYTHON_MODEL = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"


def write_model(tmp_path, samples, mbs=4, files=None):
    folder = tmp_path / "repo" / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(PYTHON_MODEL)
    (folder / "config.pbtxt").write_text(CONFIG.format(mbs=mbs, samples=samples))
    for name, data in (files or {}).items():
        (folder / "warmup").mkdir(exist_ok=True)
        (folder / "warmup" / name).write_bytes(data)
    return folder


def warmup_problems(tmp_path):
    return [p for p in validate_repository(tmp_path / "repo") if p.field.startswith("model_warmup")]


def test_good_samples_validate_clean(tmp_path):
    files = {"x.bin": np.zeros(3, "<f4").tobytes(), "s.bin": encode_bytes_elements([b"a", b"b"])}
    write_model(tmp_path, f'{{ name: "a" batch_size: 4 count: 3 {GOOD_X} {GOOD_S} }}, '
                          f'{{ name: "b" batch_size: 1 {FILE_X} {FILE_S} }}', files=files)
    assert warmup_problems(tmp_path) == []


BAD = [
    (f'{{ name: "big" batch_size: 5 {GOOD_X} {GOOD_S} }}', "model_warmup[0]", "batch_size 5 is above the model's "
     "max_batch_size 4"),
    (f'{{ name: "lacks" batch_size: 1 {GOOD_X} }}', "model_warmup[0].inputs", "lacks the required input(s) S"),
    (f'{{ name: "dims" batch_size: 1 {GOOD_X.replace("[ 3 ]", "[ 4 ]")} {GOOD_S} }}',
     "model_warmup[0].inputs['X'].dims", "has dims [4] but the model declares [3]"),
    (f'{{ name: "type" batch_size: 1 {GOOD_X.replace("TYPE_FP32", "TYPE_INT32")} {GOOD_S} }}',
     "model_warmup[0].inputs['X'].data_type", "is TYPE_INT32 but the model expects TYPE_FP32"),
    (f'{{ name: "wild" batch_size: 1 {GOOD_X.replace("[ 3 ]", "[ -1 ]")} {GOOD_S} }}', "model_warmup[0]",
     "all variable-size dimensions are specified for input 'X'"),
    (f'{{ name: "short" batch_size: 1 {FILE_X} {GOOD_S} }}',
     "model_warmup[0]", "warmup sample 'short' input 'X': warmup setting expects 12 bytes, but the data provided from "
     "x.bin only has 8 bytes"),
    (f'{{ name: "gone" batch_size: 1 {ABSENT_X} {GOOD_S} }}',
     "model_warmup[0]", "warmup sample 'gone' input 'X': failed to open text file for read"),
    (f'{{ name: "str" batch_size: 1 {GOOD_X} {FILE_S} }}',
     "model_warmup[0]", "expected 2 string elements for inference input 'S' for model 'm', got 1"),
]


@pytest.mark.parametrize("sample, field, words", BAD, ids=[b[0].split('"')[1] for b in BAD])
def test_validate_reports_a_bad_sample_as_an_error(tmp_path, sample, field, words):
    write_model(tmp_path, sample, files={"x.bin": b"\0" * 8, "s.bin": encode_bytes_elements([b"one"])})
    problems = warmup_problems(tmp_path)
    assert [(p.severity, p.field) for p in problems] == [("error", field)]
    assert words in problems[0].message and problems[0].model == "m"


def test_validate_refuses_a_batch_size_above_one_without_batching(tmp_path):
    write_model(tmp_path, f'{{ name: "two" batch_size: 2 {GOOD_X} {GOOD_S} }}', mbs=0)
    (problem,) = warmup_problems(tmp_path)
    assert problem.severity == "error" and "batch_size must be 1 for a model that does not batch" in problem.message


def test_validate_warns_about_what_triton_accepts_but_is_likely_a_mistake(tmp_path):
    control = 'inputs { key: "START" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }'
    write_model(tmp_path, f'{{ name: "a" batch_size: 0 {GOOD_X} {GOOD_S} }}, '
                          f'{{ name: "a" batch_size: 1 {GOOD_X} {GOOD_S} {control} }}, '
                          f'{{ batch_size: 1 {FILE_X} {GOOD_S} }}', files={"x.bin": b"\0" * 16})
    problems = warmup_problems(tmp_path)
    assert {p.severity for p in problems} == {"warning"}
    messages = {p.field: p.message for p in problems}
    assert "Triton skips it" in messages["model_warmup[0].batch_size"]
    assert "another sample is named 'a'" in messages["model_warmup[1].name"]
    assert "not an input of the model" in messages["model_warmup[1].inputs['START']"]
    assert "has no name" in messages["model_warmup[2].name"]
    assert "uses its first 12" in messages["model_warmup[2].inputs['X'].input_data_file"]


def test_check_warmup_says_nothing_for_a_config_without_samples(tmp_path):
    assert check_warmup(mc.ModelConfig(name="m", backend="python"), "m", tmp_path) == []


def test_samples_prepend_the_batch_dimension_only_when_the_model_batches(tmp_path):
    for mbs, shape in ((4, (1, 3)), (0, (3,))):
        folder = write_model(tmp_path / str(mbs), f'{{ name: "a" batch_size: 1 count: 0 {GOOD_X} {GOOD_S} }}', mbs=mbs)
        (sample,) = warmup_samples(load_config(folder), folder)
        assert sample.inputs["X"].shape == shape and sample.count == 1
        assert sample.inputs["S"].tolist() == ([[b"", b""]] if mbs else [b"", b""])


# --------------------------------------------------------------------------- the fraud export


@pytest.fixture(scope="module")
def warm_repo(trained, tmp_path_factory):
    return export_fraud_repository(trained, tmp_path_factory.mktemp("warm") / "repo", warmup=True)


def test_the_default_export_has_no_warm_up(trained, tmp_path):
    repo = export_fraud_repository(trained, tmp_path / "repo")
    for model in ("preprocessing", "fil", "ensemble"):
        assert not load_config(repo / model).model_warmup
        assert not (repo / model / "warmup").exists()


def test_the_warm_export_has_a_transaction_for_preprocessing_and_zeros_for_the_trees(warm_repo):
    assert validate_repository(warm_repo) == []
    (sample,) = load_config(warm_repo / "preprocessing").model_warmup
    assert sample.batch_size == 1 and set(sample.inputs) == set(fraud.RAW_INPUT_COLUMNS)
    assert all(spec.WhichOneof("input_data_type") == "input_data_file" for spec in sample.inputs.values())
    assert sample.inputs["Errors?"].input_data_file == "errors.bin"
    amount = (warm_repo / "preprocessing" / "warmup" / sample.inputs["Amount"].input_data_file).read_bytes()
    assert decode_bytes_elements(amount) == [b"$134.09"]
    year = (warm_repo / "preprocessing" / "warmup" / sample.inputs["Year"].input_data_file).read_bytes()
    assert np.frombuffer(year, "<f4").tolist() == [2002.0]
    (trees,) = load_config(warm_repo / "fil").model_warmup
    assert trees.batch_size == 1 and trees.inputs["input__0"].zero_data
    assert list(trees.inputs["input__0"].dims) == [15]
    assert not load_config(warm_repo / "ensemble").model_warmup  # Triton forbids it on an ensemble


def test_the_served_warm_export_runs_its_samples_and_they_are_accepted(warm_repo, fraud_frame):
    with serve(warm_repo, model_control_mode="explicit", load_models=["preprocessing", "fil"]) as server:
        assert server.is_server_ready()  # a sample the preprocessing refused would have failed the load
        counts = {s["name"]: s["inference_count"] for s in server.statistics()["model_stats"]}
        assert counts == {"preprocessing": 1, "fil": 1}  # each warm-up ran once, on the one instance
        server.load_model("ensemble")
        client = server.client()
        row = fraud.request_tensors(fraud_frame.head(1))
        assert client.infer("ensemble", row).as_numpy("predictions").shape == (1,)  # FIL squeezes dims [1]


def test_the_preprocessing_turns_the_warm_up_transaction_into_finite_features(warm_repo):
    config = load_config(warm_repo / "preprocessing")
    (sample,) = warmup_samples(config, warm_repo / "preprocessing")
    assert sample.inputs["Merchant City"].tolist() == [[WARMUP_TRANSACTION["Merchant City"].encode()]]
    with serve(warm_repo) as server:
        features = server.client().infer("preprocessing", sample.inputs).as_numpy("OUTPUT")
    assert features.shape == (1, len(fraud.FEATURE_NAMES)) and np.isfinite(features).all()
    names = list(fraud.FEATURE_NAMES)
    assert features[0, names.index("Year")] == 2002 and features[0, names.index("Hour")] == 6


def test_errors_only_keeps_the_warm_export_loadable(warm_repo):
    assert errors_only(validate_repository(warm_repo)) == []


def test_the_cli_exports_warm_up_and_validate_checks_its_files(tmp_path, capsys):
    from triton_nb.cli import main

    out = tmp_path / "repo"
    assert main(["export", "--model-repository", str(out), "--rows", "3000", "--rounds", "2", "--warmup"]) == 0
    assert load_config(out / "preprocessing").model_warmup and load_config(out / "fil").model_warmup
    capsys.readouterr()
    assert main(["validate", "--model-repository", str(out)]) == 0
    assert "0 error(s), 0 warning(s)" in capsys.readouterr().out
    (out / "preprocessing" / "warmup" / "year.bin").write_bytes(b"\0\0")
    assert main(["validate", "--model-repository", str(out)]) == 1
    assert ("error: model 'preprocessing': config.pbtxt: model_warmup[0]: warmup sample 'tabformer_transaction' "
            "input 'Year': warmup setting expects 4 bytes, but the data provided from year.bin only has 2 bytes"
            in capsys.readouterr().out)
