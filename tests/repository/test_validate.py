"""Repository validation and layout: one failing fixture per rule, each message located."""

from __future__ import annotations

from pathlib import Path

import pytest

from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.repository import scan_repository, validate_repository
from triton_nb.repository.config import parse_config
from triton_nb.repository.layout import select_versions

PRE = """
name: "pre"
backend: "python"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "NUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""
TREES = """
name: "trees"
backend: "fil"
max_batch_size: 8
input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "model_type" value: { string_value: "xgboost_json" } }
parameters { key: "output_class" value: { string_value: "true" } }
parameters { key: "threshold" value: { string_value: "0.5" } }
"""
ENS = """
name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "NUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "predictions" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "pre" model_version: -1
      input_map { key: "TEXT" value: "TEXT" } input_map { key: "NUM" value: "NUM" }
      output_map { key: "OUTPUT" value: "features" } },
    { model_name: "trees" model_version: -1
      input_map { key: "input__0" value: "features" }
      output_map { key: "output__0" value: "predictions" } }
  ]
}
"""


def write_repo(root: Path, pre: str = PRE, trees: str = TREES, ens: str = ENS) -> Path:
    for name, text, files in (("pre", pre, ["model.py"]), ("trees", trees, ["xgboost.json"]), ("ens", ens, [])):
        if text is None:
            continue
        folder = root / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "config.pbtxt").write_text(text)
        for file in files:
            (folder / "1" / file).write_text("{}")
    return root


def problems_of(root: Path) -> list:
    return validate_repository(root)


def test_valid_repository_has_no_problems(tmp_path):
    assert problems_of(write_repo(tmp_path)) == []


def _has(problems, model, field, text, severity="error"):
    return any(p.model == model and p.field == field and text in p.message and p.severity == severity
               for p in problems)


@pytest.mark.parametrize(
    ("ens_text", "field", "message"),
    [
        (ENS.replace('model_name: "trees"', 'model_name: "forest"'), "ensemble_scheduling.step[1].model_name",
         "model 'forest' is not in the repository"),
        (ENS.replace('input_map { key: "NUM" value: "NUM" }', ""), "ensemble_scheduling.step[0].input_map",
         "input 'NUM' of model 'pre' is not mapped"),
        (ENS.replace('input_map { key: "NUM" value: "NUM" }', 'input_map { key: "NUM" value: "NUM" } '
                     'input_map { key: "EXTRA" value: "NUM" }'),
         "ensemble_scheduling.step[0].input_map", "model 'pre' has no input 'EXTRA'"),
        (ENS.replace('output_map { key: "output__0"', 'output_map { key: "output__9"'),
         "ensemble_scheduling.step[1].output_map", "model 'trees' has no output 'output__9'"),
        (ENS.replace('value: "predictions" }', 'value: "scores" }'), "output",
         "ensemble output 'predictions' is not written by any step"),
        (ENS.replace('output_map { key: "OUTPUT" value: "features" }', 'output_map { key: "OUTPUT" value: "NUM" }'),
         "ensemble_scheduling.step[0].output_map", "ensemble tensor 'NUM' is written more than once"),
        (ENS.replace('{ name: "predictions" data_type: TYPE_FP32', '{ name: "predictions" data_type: TYPE_INT32'),
         "output", "output of 'trees' 'output__0' is TYPE_FP32 but ensemble output 'predictions' is TYPE_INT32"),
        (ENS.replace('{ name: "NUM" data_type: TYPE_FP32 dims: [ 1 ] }', '{ name: "NUM" data_type: TYPE_FP32 '
                     'dims: [ 2 ] }'),
         "ensemble_scheduling.step[0].input_map", "has dims [2] but input of 'pre' 'NUM' has [1]"),
        (ENS.replace("max_batch_size: 8", "max_batch_size: 16"), "max_batch_size",
         "16 is above the max_batch_size 8 of model 'pre'"),
        (ENS.replace('input_map { key: "input__0" value: "features" }', 'input_map { key: "input__0" value: "x" }'),
         "ensemble_scheduling", "tensor 'x' is read by step 1 but no ensemble input or step output provides it"),
        (ENS.replace('step [\n', 'step [\n    { model_name: "trees" input_map { key: "input__0" value: "loop" } '
                     'output_map { key: "output__0" value: "loop" } },\n'),
         "ensemble_scheduling", "the steps form a cycle"),
        (ENS.replace("max_batch_size: 8\n", "max_batch_size: 8\ninstance_group [ { count: 1 } ]\n"),
         "instance_group", "an ensemble must not have instance groups"),
    ],
)
def test_ensemble_rules(tmp_path, ens_text, field, message):
    problems = problems_of(write_repo(tmp_path, ens=ens_text))
    assert _has(problems, "ens", field, message), problems
    assert all(str(p).startswith(("error: model '", "warning: model '")) for p in problems)


def test_composing_model_that_does_not_batch(tmp_path):
    problems = problems_of(write_repo(tmp_path, pre=PRE.replace("max_batch_size: 8", "max_batch_size: 0")))
    assert _has(problems, "ens", "max_batch_size", "model 'pre' does not (max_batch_size 0)")


def test_unused_ensemble_input_is_a_warning(tmp_path):
    text = ENS.replace('{ name: "NUM" data_type: TYPE_FP32 dims: [ 1 ] } ]',
                       '{ name: "NUM" data_type: TYPE_FP32 dims: [ 1 ] }, '
                       '{ name: "SPARE" data_type: TYPE_FP32 dims: [ 1 ] } ]')
    assert _has(problems_of(write_repo(tmp_path, ens=text)), "ens", "input",
                "ensemble input 'SPARE' is not used", "warning")


def test_version_folders_and_backend_files(tmp_path):
    root = write_repo(tmp_path)
    (root / "trees" / "1" / "xgboost.json").unlink()
    (root / "pre" / "1" / "model.py").unlink()
    (root / "pre" / "latest").mkdir()
    problems = problems_of(root)
    assert any(p.model == "trees" and p.file == "1/xgboost.json" and "fil backend loads 'xgboost.json'"
               in p.message for p in problems)
    assert any(p.model == "pre" and p.file == "1/model.py" for p in problems)
    assert any(p.model == "pre" and p.file == "latest/" and p.severity == "warning" for p in problems)
    (root / "ens" / "1").rmdir()
    assert _has(problems_of(root), "ens", "version", "no numeric version folder")


def test_version_policy(tmp_path):
    root = write_repo(tmp_path, pre=PRE + "version_policy { specific { versions: [ 3, 7 ] } }")
    (root / "pre" / "3").mkdir()
    (root / "pre" / "3" / "model.py").write_text("")
    problems = problems_of(root)
    assert _has(problems, "pre", "version_policy.specific", "version 7 has no folder", "warning")
    root2 = write_repo(tmp_path / "b", pre=PRE + "version_policy { specific { versions: [ 9 ] } }")
    assert _has(problems_of(root2), "pre", "version_policy", "matches the policy")


def test_select_versions():
    versions = [1, 2, 5, 10]
    assert select_versions(parse_config(""), versions) == [10]
    assert select_versions(parse_config("version_policy { latest { num_versions: 2 } }"), versions) == [5, 10]
    assert select_versions(parse_config("version_policy { all { } }"), versions) == versions
    assert select_versions(parse_config("version_policy { specific { versions: [ 2, 3 ] } }"), versions) == [2]


def test_a_broken_model_does_not_hide_the_others(tmp_path):
    root = write_repo(tmp_path, trees="name: [broken")
    problems = problems_of(root)
    broken = [p for p in problems if p.model == "trees"]
    assert broken and broken[0].file == "config.pbtxt" and "trees" in broken[0].message
    scan = scan_repository(root)
    assert scan["pre"].config is not None and scan["trees"].config is None and scan["trees"].error


def test_fingerprint_changes_with_content(tmp_path):
    root = write_repo(tmp_path)
    entry = scan_repository(root)["pre"]
    before = entry.fingerprint(1)
    assert before == scan_repository(root)["pre"].fingerprint(1)
    (root / "pre" / "1" / "model.py").write_text("# changed")
    assert scan_repository(root)["pre"].fingerprint(1) != before
    (root / "pre" / "config.pbtxt").write_text(PRE + "\n# comment")
    assert scan_repository(root)["pre"].fingerprint(1) != before


def test_repository_path_errors(tmp_path):
    with pytest.raises(NotFoundError, match="does not exist"):
        validate_repository(tmp_path / "nowhere")
    root = write_repo(tmp_path)
    with pytest.raises(InvalidArgumentError, match="model folder"):
        validate_repository(root / "pre")
    with pytest.raises(NotFoundError, match="no model 'nope'"):
        scan_repository(root)["nope"]
