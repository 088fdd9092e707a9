"""No config field is silently ignored: each is served, refused at load and by validate, or
warned about where Triton itself ignores it; a schema field without a rule fails this suite."""

from __future__ import annotations

import logging

import pytest
from google.protobuf.descriptor import Descriptor
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb.errors import InvalidArgumentError
from triton_nb.repository import validate_repository
from triton_nb.repository.config import check_model_config, parse_config
from triton_nb.repository.fields import DIFFERS, FIELD_RULES, REFUSED, SERVED, WARNED, check_fields


def schema_paths(descriptor: Descriptor, prefix: str = "") -> list[str]:
    """Every field path of the schema below messages whose rule is SERVED or DIFFERS or depends on the model
    (a refused or warned message is judged as a whole; a map is one field)."""
    paths = []
    for field in descriptor.fields:
        path = f"{prefix}{field.name}"
        paths.append(path)
        message = field.message_type
        if message is None or message.GetOptions().map_entry:
            continue
        rule = FIELD_RULES.get(path)
        if rule is not None and (rule.status in (SERVED, DIFFERS) or rule.when is not None):  # may be served
            paths.extend(schema_paths(message, f"{path}."))
    return paths


def test_every_field_of_the_schema_has_a_rule():
    missing = [path for path in schema_paths(mc.ModelConfig.DESCRIPTOR) if path not in FIELD_RULES]
    assert missing == [], f"ModelConfig fields with no rule in FIELD_RULES: {missing}"
    assert {rule.status for rule in FIELD_RULES.values()} == {SERVED, REFUSED, WARNED, DIFFERS}
    assert all(rule.reason for rule in FIELD_RULES.values() if rule.status != SERVED)
    stale = [path for path in FIELD_RULES if path not in schema_paths(mc.ModelConfig.DESCRIPTOR)]
    assert stale == [], f"rules for fields the schema does not have: {stale}"


CONFIG = """
name: "m"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] {input_extra} }},
        {{ name: "W" data_type: TYPE_FP32 dims: [ 2 ] {input_extra} }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }} ]
{extra}
"""


@pytest.mark.parametrize(("extra", "input_extra", "field", "severity"), [
    ("sequence_batching { iterative_sequence: true }", "", "sequence_batching.iterative_sequence", "error"),
    ("", "allow_ragged_batch: true", "input[0].allow_ragged_batch", "error"),
    ("", "reshape { shape: [ 1, 2 ] }", "input[0].reshape", "error"),
    ('batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "N" data_type: TYPE_FP32 '
     'source_input: "X" } ]', "", "batch_input", "error"),
    ('model_repository_agents { agents [ { name: "checksum" } ] }', "", "model_repository_agents", "error"),
    ("optimization { eager_batching: true }", "", "optimization.eager_batching", "warning"),
    ("optimization { cuda { graphs: true } }", "", "optimization.cuda", "warning"),
    ("optimization { input_pinned_memory { enable: false } }", "", "optimization.input_pinned_memory", "warning"),
    ("instance_group [ { kind: KIND_CPU passive: true } ]", "", "instance_group[0].passive", "error"),
    ("model_transaction_policy { decoupled: true } response_cache { enable: true }", "", "response_cache.enable",
     "error"),
])
def test_a_field_triton_nb_does_not_serve_is_named_with_its_reason(extra, input_extra, field, severity):
    config = parse_config(CONFIG.format(extra=extra, input_extra=input_extra))
    findings = check_fields(config)
    assert [(f.severity, f.field) for f in findings] == [(severity, field)]  # once, though two inputs set it
    problems = [p for p in check_model_config(config, "m") if p.field == field]
    assert len(problems) == 1 and problems[0].severity == severity and "'m'" in str(problems[0])
    assert findings[0].message.startswith("not supported by triton_nb: " if severity == "error"
                                          else "has no effect here: ")


def test_what_is_served_raises_nothing():
    config = parse_config(CONFIG.format(extra='dynamic_batching { max_queue_delay_microseconds: 100 '
                                              'default_queue_policy { max_queue_size: 4 } } '
                                              'instance_group [ { kind: KIND_CPU count: 2 rate_limiter { '
                                              'resources [ { name: "R" count: 1 } ] priority: 2 } } ] '
                                              'parameters { key: "k" value { string_value: "v" } } '
                                              'version_policy { latest { num_versions: 1 } } '
                                              'response_cache { enable: true }',
                                        input_extra="optional: false"))
    assert check_fields(config) == []


def test_reshape_is_served_by_onnxruntime_only():
    text = CONFIG.format(extra="", input_extra="reshape { shape: [ 1, 2 ] }")
    assert check_fields(parse_config(text.replace('backend: "python"', 'backend: "onnxruntime"'))) == []
    assert check_fields(parse_config(text.replace('backend: "python"', 'platform: "onnxruntime_onnx"'))) == []


def write(repo, extra: str) -> None:
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.py").write_text(
        "import triton_python_backend_utils as pb_utils\n\n\nclass TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        return [pb_utils.InferenceResponse([pb_utils.Tensor('Y', pb_utils.get_input_tensor_by_name(r, 'X')"
        ".as_numpy())]) for r in requests]\n")
    (repo / "m" / "config.pbtxt").write_text(CONFIG.format(extra=extra, input_extra="").replace(
        """        {{ name: "W" data_type: TYPE_FP32 dims: [ 2 ] }} ]""", "]"))


def test_a_refused_field_fails_the_load_and_validate_naming_model_and_field(tmp_path):
    from triton_nb.serving import serve

    write(tmp_path, "sequence_batching { iterative_sequence: true }")
    problems = validate_repository(tmp_path)
    assert any(p.severity == "error" and p.field == "sequence_batching.iterative_sequence" and p.model == "m"
               for p in problems)
    refused = r"model 'm'.*sequence_batching.iterative_sequence: not supported by triton_nb"
    with serve(tmp_path, model_control_mode="explicit") as server, pytest.raises(InvalidArgumentError, match=refused):
        server.load_model("m")


def test_a_warned_field_loads_with_one_warning_in_the_log_and_status(tmp_path, caplog):
    from triton_nb.serving import serve

    write(tmp_path, "optimization { cuda { graphs: true } }")
    with caplog.at_level(logging.WARNING, logger="triton_nb.server.models.manager"), serve(tmp_path) as server:
        assert server.is_model_ready("m")
        warnings = server.config_warnings("m")
        server.load_model("m")  # a reload with the same config says nothing new
    assert len(warnings) == 1 and warnings[0].startswith("optimization.cuda: has no effect here")
    logged = [r.getMessage() for r in caplog.records if "optimization.cuda" in r.getMessage()]
    assert logged == [f"model 'm': {warnings[0]}"]
