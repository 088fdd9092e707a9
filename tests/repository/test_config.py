"""config.pbtxt through protobuf: round trips, Triton's JSON, defaults, per-model rules."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.repository.config import (
    check_model_config,
    config_from_json,
    config_to_json,
    effective_config,
    format_config,
    load_config,
    model_filename,
    parse_config,
    preferred_batch_sizes,
    save_config,
)

FIL = """
name: "fil"
backend: "fil"
max_batch_size: 8192
input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 15 ] } ]
output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_AUTO } ]
parameters { key: "model_type" value: { string_value: "xgboost_json" } }
parameters { key: "output_class" value: { string_value: "true" } }
parameters { key: "threshold" value: { string_value: "0.5" } }
dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [ 64, 256 ] }
"""


def test_pbtxt_round_trip(tmp_path):
    config = parse_config(FIL)
    assert config.max_batch_size == 8192
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_AUTO
    text = format_config(config)
    assert parse_config(text) == config
    path = save_config(config, tmp_path)
    assert path.name == "config.pbtxt"
    assert load_config(tmp_path) == config


def test_json_uses_tritons_conventions():
    data = config_to_json(parse_config(FIL))
    assert data["max_batch_size"] == 8192
    assert data["input"][0]["data_type"] == "TYPE_FP32"  # enums as names
    assert data["input"][0]["dims"] == [15]  # int64 as numbers, not strings
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert data["instance_group"][0]["kind"] == "KIND_AUTO"
    assert data["parameters"]["model_type"] == {"string_value": "xgboost_json"}
    assert config_from_json(data) == parse_config(FIL)
    assert config_from_json('{"name": "m", "max_batch_size": "4"}').max_batch_size == 4


def test_unknown_fields_are_errors_naming_the_file_and_line(tmp_path):
    with pytest.raises(InvalidArgumentError, match=r"config\.pbtxt: 3:1 .*max_batch_sise"):
        parse_config('name: "m"\nbackend: "python"\nmax_batch_sise: 4\n')
    (tmp_path / "config.pbtxt").write_text("name: [unterminated")
    with pytest.raises(InvalidArgumentError, match=str(tmp_path)):
        load_config(tmp_path)
    with pytest.raises(InvalidArgumentError, match="nope"):
        config_from_json({"name": "m", "nope": 1})
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        config_from_json("{")
    with pytest.raises(NotFoundError):
        load_config(tmp_path / "missing")


def test_effective_config_applies_tritons_defaults():
    bare = parse_config('backend: "python" max_batch_size: 8 dynamic_batching { }')
    effective = effective_config(bare, "prep")
    assert effective.name == "prep"
    assert effective.version_policy.latest.num_versions == 1
    assert len(effective.instance_group) == 1
    group = effective.instance_group[0]
    assert (group.count, group.kind, group.name) == (1, mc.ModelInstanceGroup.KIND_CPU, "prep")
    assert preferred_batch_sizes(effective) == [8]  # empty preferred sizes mean max_batch_size
    auto = effective_config(parse_config(FIL), "fil")
    assert auto.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU  # no GPU here
    assert auto.instance_group[0].count == 2 and auto.instance_group[0].name == "fil_0"
    assert effective_config(parse_config(FIL), "fil", gpu_available=True).instance_group[0].kind == (
        mc.ModelInstanceGroup.KIND_GPU
    )
    assert preferred_batch_sizes(auto) == [64, 256]
    assert not effective_config(parse_config('platform: "ensemble"'), "e").instance_group
    onnx = effective_config(parse_config('platform: "onnxruntime_onnx"'), "o")
    assert onnx.backend == "onnxruntime"
    with pytest.raises(InvalidArgumentError, match="'fil' does not match the model folder name 'other'"):
        effective_config(parse_config(FIL), "other")


def test_model_filename_per_backend():
    assert model_filename(parse_config(FIL)) == "xgboost.json"
    assert model_filename(parse_config('backend: "python"')) == "model.py"
    assert model_filename(parse_config('backend: "onnxruntime"')) == "model.onnx"
    assert model_filename(parse_config('backend: "python" default_model_filename: "m2.py"')) == "m2.py"
    assert model_filename(parse_config('platform: "ensemble"')) is None
    # FIL's default model_type (fil_backend's shared_state.h) is the legacy binary format
    no_type = FIL.replace('parameters { key: "model_type" value: { string_value: "xgboost_json" } }', "")
    assert model_filename(parse_config(no_type)) == "xgboost.model"
    assert not [p for p in check_model_config(parse_config(no_type), "m") if p.field == "parameters.model_type"]
    for model_type, filename in (("xgboost", "xgboost.model"), ("xgboost_ubj", "xgboost.ubj"),
                                 ("lightgbm", "model.txt"), ("treelite_checkpoint", "checkpoint.tl")):
        config = parse_config(FIL.replace("xgboost_json", model_type))
        assert model_filename(config) == filename


def _fil(**replacements: str) -> str:
    text = FIL
    for old, new in replacements.items():
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        (_fil(xgboost_json="catboost"), "parameters.model_type", "'catboost' is not one of"),
        (FIL.replace('parameters { key: "output_class" value: { string_value: "true" } }', ""),
         "parameters.output_class", "Required parameter output_class not found in config"),
        (FIL.replace('parameters { key: "threshold" value: { string_value: "0.5" } }', ""),
         "parameters.threshold", "Required parameter threshold not found in config"),
        (_fil(**{'"0.5"': '"half"'}), "parameters.threshold", "'half' is not a number"),
        (_fil(input__0="features"), "input", "exactly one input, named 'input__0'"),
        (_fil(**{"name: \"input__0\" data_type: TYPE_FP32": 'name: "input__0" data_type: TYPE_FP64'}),
         "input[0].data_type", "must be TYPE_FP32"),
        (_fil(output__0="prob"), "output", "named 'output__0'"),
        (FIL.replace('output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] } ]',
                     'output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] }, '
                     '{ name: "treeshap_output" data_type: TYPE_FP32 dims: [ 15 ] } ]'),
         "output", "treeshap_output dims [15] must end in num_features + 1 = 16"),
        (_fil(**{"dims: [ 1 ]": "dims: [ 3 ]"}), "output", "without predict_proba has dims [1]"),
        (_fil(**{"dims: [ 1 ]": "dims: [ 1, -1 ]"}), "output",
         "output__0 dims [1, -1]: Backends with variable-shape outputs must request desired output shape"),
        (FIL + 'parameters { key: "storage_type" value: { string_value: "DENSEST" } }', "parameters.storage_type",
         "'DENSEST' is not one of"),
        (_fil(**{"preferred_batch_size: [ 64, 256 ]": "preferred_batch_size: [ 10000 ]"}),
         "dynamic_batching.preferred_batch_size", "between 1 and max_batch_size"),
        (_fil(**{"max_batch_size: 8192": "max_batch_size: 0"}), "dynamic_batching", "needs max_batch_size > 0"),
        (_fil(**{"dims: [ 15 ]": "dims: [ 0 ]"}), "input[0].dims", "invalid dims"),
    ],
)
def test_fil_rules(text, field, message):
    problems = check_model_config(parse_config(text), "fil")
    assert any(p.field == field and message in p.message for p in problems), problems
    assert all(p.model == "fil" and p.file == "config.pbtxt" for p in problems)


def test_valid_fil_config_has_no_problems():
    assert check_model_config(parse_config(FIL), "fil") == []
    newer = FIL.replace('key: "output_class"', 'key: "is_classifier"')  # FIL >= 25.09 spelling
    assert check_model_config(parse_config(newer), "fil") == []


def test_treeshap_parameter_is_a_warning():
    text = FIL + 'parameters { key: "treeshap_output" value: { string_value: "true" } }'
    [problem] = check_model_config(parse_config(text), "fil")
    assert problem.severity == "warning" and "output is named 'treeshap_output'" in problem.message


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("instance_group [ { count: 1 } ]", "instance_group"),
        ("optimization { priority: PRIORITY_MAX }", "optimization"),
        ('model_warmup [ { name: "w" batch_size: 1 } ]', "model_warmup"),
    ],
)
def test_ensemble_must_not_have(extra, field):
    text = 'platform: "ensemble" max_batch_size: 4 ensemble_scheduling { step [ { model_name: "a" } ] } ' + extra
    problems = check_model_config(parse_config(text), "ens")
    assert any(p.field == field for p in problems), problems


def test_problem_is_one_line_with_model_file_and_field():
    problem = check_model_config(parse_config(_fil(xgboost_json="catboost")), "fil")[0]
    assert str(problem) == (
        "error: model 'fil': config.pbtxt: parameters.model_type: 'catboost' is not one of "
        "xgboost, xgboost_json, xgboost_ubj, lightgbm, treelite_checkpoint"
    )


PYTHON = 'backend: "python" max_batch_size: 4 input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ] ' \
         'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ] '


@pytest.mark.parametrize(("path", "inside"), [
    ("$$TRITON_MODEL_DIRECTORY/env.tar.gz", True),
    ("$$TRITON_MODEL_DIRECTORY/envs/py311.tar.gz", True),
    ("/opt/envs/py311.tar.gz", False),
    ("$$TRITON_MODEL_DIRECTORY/../other/env.tar.gz", False),
    ("$$TRITON_MODEL_DIRECTORY/envs/../../env.tar.gz", False),
    ("env.tar.gz", False),
    ("$$TRITON_MODEL_DIRECTORY\\..\\env.tar.gz", False),
])
def test_execution_env_path_must_stay_in_the_model_folder(path, inside):
    text = PYTHON + f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{path}" }} }}'
    text = text.replace("\\", "\\\\")  # protobuf text escapes
    problems = check_model_config(parse_config(text), "preprocessing")
    if inside:
        assert problems == []
    else:
        [problem] = problems
        assert problem.field == "parameters.EXECUTION_ENV_PATH" and problem.model == "preprocessing"
        assert "must be inside the model folder" in problem.message and path in problem.message
