"""Exporting the fraud pipeline: folder contents, configs, options, atomic writes, SageMaker."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import xgboost as xgb
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb import fraud
from triton_nb.errors import InvalidArgumentError
from triton_nb.fraud import encoding
from triton_nb.repository import (
    BatchingOptions,
    export_fraud_repository,
    load_config,
    package_for_sagemaker,
    validate_repository,
)

RAW = list(fraud.RAW_INPUT_COLUMNS)
FP32 = {"User", "Card", "Year", "Month", "Day"}
ENCODING_SOURCES = sorted(path.name for path in Path(encoding.__file__).parent.glob("*.py"))


@pytest.fixture(scope="module")
def repo(trained, tmp_path_factory):
    return export_fraud_repository(trained, tmp_path_factory.mktemp("export") / "repo")


def files_of(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_folder_contents(repo):
    assert files_of(repo) == [
        "ensemble/config.pbtxt",
        "fil/1/xgboost.json",
        "fil/config.pbtxt",
        *(f"preprocessing/1/fraud_encoding/{name}" for name in ENCODING_SOURCES),
        "preprocessing/1/fraud_safe_pickle.py",
        "preprocessing/1/label_encoders.json",
        "preprocessing/1/label_encoders.pkl",
        "preprocessing/1/model.py",
        "preprocessing/config.pbtxt",
    ]
    assert (repo / "ensemble" / "1").is_dir()
    assert validate_repository(repo) == []


def test_the_encoding_package_ships_whole_and_as_it_is(repo):
    # fraud_encoding/ is triton_nb.fraud.encoding itself, every module of it and nothing more
    assert {"__init__.py", "encoder.py", "rows.py"} <= set(ENCODING_SOURCES)
    source = Path(encoding.__file__).parent
    for name in ENCODING_SOURCES:
        assert (repo / "preprocessing" / "1" / "fraud_encoding" / name).read_bytes() == (source / name).read_bytes()


def test_the_encoding_package_imports_numpy_and_its_own_modules_alone():
    # It runs in Triton images, where triton_nb is not installed; its modules import one another
    # relatively (so they work as fraud_encoding.*) and in one direction, each from those before.
    order = ["columns", "text", "numeric", "spellings", "rows", "encoder", "__init__"]
    assert sorted(order) == sorted(name.removesuffix(".py") for name in ENCODING_SOURCES)
    for path in Path(encoding.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1, (path.name, node.module)
                for module in [node.module] if node.module else [alias.name for alias in node.names]:
                    assert order.index(module.partition(".")[0]) < order.index(path.stem), (path.name, module)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module]
                for name in names:
                    top = name.partition(".")[0]
                    assert top in ("numpy", "__future__") or top in sys.stdlib_module_names, (path.name, name)


def test_a_shipped_package_leaves_bytecode_and_other_files_behind(tmp_path, monkeypatch):
    from triton_nb.repository.export import _write_package

    package = tmp_path / "src" / "rules_pkg"
    (package / "__pycache__").mkdir(parents=True)
    (package / "__pycache__" / "part.cpython-312.pyc").write_bytes(b"bytecode")
    (package / "sub" / "__pycache__").mkdir(parents=True)
    (package / "notes").mkdir()  # a folder that is no package
    (package / "notes" / "todo.py").write_text("X = 0\n")
    for name, text in {"__init__.py": "from . import part\n", "part.py": "X = 1\n", "README.txt": "words",
                       "sub/__init__.py": "", "sub/deep.py": "Y = 2\n", "part.pyc": "stale"}.items():
        (package / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    (tmp_path / "out").mkdir()
    try:
        _write_package("rules_pkg", tmp_path / "out" / "shipped")
    finally:  # finding its files imported it: it must not linger for later tests
        for name in [name for name in sys.modules if name.partition(".")[0] == "rules_pkg"]:
            del sys.modules[name]
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*")) == [
        "shipped", "shipped/__init__.py", "shipped/part.py", "shipped/sub", "shipped/sub/__init__.py",
        "shipped/sub/deep.py",
    ]


def test_preprocessing_config_has_the_examples_tensors(repo):
    config = load_config(repo / "preprocessing")
    assert config.backend == "python"
    assert [t.name for t in config.input] == RAW
    for tensor in config.input:
        assert list(tensor.dims) == [1]
        assert tensor.data_type == (mc.TYPE_FP32 if tensor.name in FP32 else mc.TYPE_STRING), tensor.name
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [("OUTPUT", mc.TYPE_FP32, [15])]
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


def test_fil_config(repo, trained):
    config = load_config(repo / "fil")
    assert config.backend == "fil"
    assert [(t.name, list(t.dims)) for t in config.input] == [("input__0", [15])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("output__0", [1])]
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    assert parameters["model_type"] == "xgboost_json"
    assert parameters["output_class"] == "true"
    assert parameters["predict_proba"] == "false"
    assert parameters["threshold"] == "0.5"
    assert parameters["storage_type"] == "AUTO"
    assert config.HasField("dynamic_batching") and len(config.instance_group) == 1
    booster = xgb.Booster(model_file=str(repo / "fil" / "1" / "xgboost.json"))
    assert booster.num_boosted_rounds() == trained.best_iteration + 1


def test_ensemble_config(repo):
    config = load_config(repo / "ensemble")
    assert config.platform == "ensemble"
    assert [t.name for t in config.input] == RAW
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [("predictions", mc.TYPE_FP32, [1])]
    first, second = config.ensemble_scheduling.step
    assert first.model_name == "preprocessing" and dict(first.output_map) == {"OUTPUT": "preprocessed_data"}
    assert dict(first.input_map) == {name: name for name in RAW}
    assert second.model_name == "fil"
    assert dict(second.input_map) == {"input__0": "preprocessed_data"}
    assert dict(second.output_map) == {"output__0": "predictions"}


def test_shipped_preprocessing_runs_without_triton_nb(repo, trained, fraud_frame, tmp_path):
    # The exported model.py imports fraud_encoding and fraud_safe_pickle from its own folder;
    # they must work where triton_nb is not installed, as in a stock Triton image.
    rows = fraud_frame.head(300)
    np.save(tmp_path / "expected.npy", trained.preprocessor.transform(rows))
    rows.to_pickle(tmp_path / "rows.pkl")
    script = f"""
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] == 'triton_nb':
            raise ImportError('triton_nb is not available here')
sys.meta_path.insert(0, Block())
sys.path.insert(0, {str(repo / 'preprocessing' / '1')!r})
import numpy as np, pandas as pd
import fraud_encoding, fraud_safe_pickle
assert fraud_encoding.__file__ == {str(repo / 'preprocessing' / '1' / 'fraud_encoding' / '__init__.py')!r}
assert fraud_encoding.encoder.__name__ == 'fraud_encoding.encoder'  # its modules, relative to it
classes = fraud_safe_pickle.load_label_encoders({str(repo / 'preprocessing' / '1' / 'label_encoders.pkl')!r})
rows = pd.read_pickle({str(tmp_path / 'rows.pkl')!r})
got = fraud_encoding.FeatureEncoder(classes).transform(rows)
np.testing.assert_array_equal(got, np.load({str(tmp_path / 'expected.npy')!r}))
assert not [m for m in sys.modules if m.startswith('triton_nb')]
print('ok')
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_options(trained, tmp_path):
    batching = BatchingOptions(max_batch_size=256, max_queue_delay_microseconds=500, preferred_batch_size=(32, 64),
                               instance_count=3, instance_kind="KIND_AUTO")
    root = export_fraud_repository(trained, tmp_path / "r", batching=batching, predict_proba=True,
                                   treeshap_output=True)
    fil = load_config(root / "fil")
    assert fil.max_batch_size == 256
    assert list(fil.dynamic_batching.preferred_batch_size) == [32, 64]
    assert fil.dynamic_batching.max_queue_delay_microseconds == 500
    assert (fil.instance_group[0].count, fil.instance_group[0].kind) == (3, mc.ModelInstanceGroup.KIND_AUTO)
    assert fil.parameters["predict_proba"].string_value == "true"
    assert "treeshap_output" not in fil.parameters  # FIL asks for SHAP by the output's name
    assert [(t.name, list(t.dims)) for t in fil.output] == [("output__0", [1]), ("treeshap_output", [16])]
    ensemble = load_config(root / "ensemble")
    assert ensemble.max_batch_size == 256
    assert [t.name for t in ensemble.output] == ["predictions", "shap_values"]
    assert load_config(root / "preprocessing").instance_group[0].count == 3
    assert validate_repository(root) == []
    plain = export_fraud_repository(trained, tmp_path / "plain", batching=BatchingOptions(dynamic_batching=False))
    assert not load_config(plain / "fil").HasField("dynamic_batching")


def test_python_backend_twin(trained, tmp_path):
    root = export_fraud_repository(trained, tmp_path / "py", model_backend="python")
    assert files_of(root / "fil") == ["1/fil_semantics.py", "1/model.py", "1/xgboost.json", "config.pbtxt"]
    config = load_config(root / "fil")
    assert config.backend == "python"
    assert config.parameters["output_class"].string_value == "true"
    assert validate_repository(root) == []


def test_execution_env_is_confined_to_the_model_folder(trained, tmp_path):
    archive = tmp_path / "prep_env.tar.gz"
    with tarfile.open(archive, "w:gz"):
        pass
    root = export_fraud_repository(trained, tmp_path / "env", execution_env=archive)
    assert (root / "preprocessing" / "prep_env.tar.gz").is_file()
    value = load_config(root / "preprocessing").parameters["EXECUTION_ENV_PATH"].string_value
    assert value == "$$TRITON_MODEL_DIRECTORY/prep_env.tar.gz"
    with pytest.raises(InvalidArgumentError, match="not a conda-pack archive"):
        export_fraud_repository(trained, tmp_path / "bad", execution_env=tmp_path / "missing.zip")
    if os.environ.get("CONDA_PREFIX") is None:  # packing needs a conda environment
        with pytest.raises(InvalidArgumentError, match="execution_env='pack'"):
            export_fraud_repository(trained, tmp_path / "pack", execution_env="pack")
    assert not (tmp_path / "bad").exists()


def leftovers(parent):
    return [p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]


def test_bad_targets_and_models_leave_nothing_behind(trained, fraud_frame, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(InvalidArgumentError, match="exists and is not empty"):
        export_fraud_repository(trained, tmp_path / "taken")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidArgumentError, match="it is a file"):
        export_fraud_repository(trained, tmp_path / "file")
    with pytest.raises(InvalidArgumentError, match="cannot write the repository"):
        export_fraud_repository(trained, tmp_path / "file" / "repo")  # a folder under a file: unwritable
    wrong = fraud.TrainedFraudModel(
        preprocessor=trained.preprocessor,
        booster=xgb.train({"objective": "binary:logistic"},
                          xgb.DMatrix(np.random.default_rng(0).random((40, 10)), label=np.arange(40) % 2), 2),
        params={}, best_iteration=1, evaluation=trained.evaluation,
    )
    with pytest.raises(InvalidArgumentError, match="takes 10 features but the preprocessing produces 15"):
        export_fraud_repository(wrong, tmp_path / "wrong")
    with pytest.raises(InvalidArgumentError, match="model_backend"):
        export_fraud_repository(trained, tmp_path / "x", model_backend="tensorrt")
    with pytest.raises(InvalidArgumentError, match="preferred_batch_size"):
        export_fraud_repository(trained, tmp_path / "x", batching=BatchingOptions(preferred_batch_size=(99999,)))
    assert not (tmp_path / "wrong").exists() and not (tmp_path / "x").exists()
    assert leftovers(tmp_path) == []


def test_overwrite_replaces_atomically(trained, tmp_path):
    root = export_fraud_repository(trained, tmp_path / "r")
    (root / "stale.txt").write_text("old")
    export_fraud_repository(trained, root, overwrite=True, predict_proba=True)
    assert not (root / "stale.txt").exists()
    assert load_config(root / "fil").parameters["predict_proba"].string_value == "true"
    assert leftovers(tmp_path) == []


def test_sagemaker_package(repo, tmp_path):
    package = package_for_sagemaker(repo, tmp_path / "out" / "model.tar.gz")
    assert package.default_model_name == "ensemble"
    assert package.environment == {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "ensemble"}
    with tarfile.open(package.path) as archive:
        names = archive.getnames()
    assert "ensemble/config.pbtxt" in names and "fil/1/xgboost.json" in names
    assert "preprocessing/1/model.py" in names
    assert sorted(name for name in names if name.startswith("preprocessing/1/fraud_encoding/")) == [
        f"preprocessing/1/fraud_encoding/{name}" for name in ENCODING_SOURCES
    ]
    assert not any(name.startswith(("/", "./", "repo/")) or name == "config.pbtxt" for name in names)
    assert package_for_sagemaker(repo, tmp_path / "m2.tar.gz", default_model_name="fil").default_model_name == "fil"


def test_sagemaker_refuses_layouts_the_container_rejects(repo, tmp_path):
    with pytest.raises(InvalidArgumentError, match=r"config\.pbtxt at its root"):
        package_for_sagemaker(repo / "fil", tmp_path / "a.tar.gz")
    no_ensemble = tmp_path / "two"
    no_ensemble.mkdir()
    for name in ("fil", "preprocessing"):
        os.symlink(repo / name, no_ensemble / name)
    with pytest.raises(InvalidArgumentError, match="SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"):
        package_for_sagemaker(no_ensemble, tmp_path / "b.tar.gz")
    with pytest.raises(InvalidArgumentError, match="'nope' is not a model"):
        package_for_sagemaker(repo, tmp_path / "c.tar.gz", default_model_name="nope")
    assert not (tmp_path / "a.tar.gz").exists() and not (tmp_path / "b.tar.gz").exists()


def test_encoders_json_matches_pickle(repo, trained):
    data = json.loads((repo / "preprocessing" / "1" / "label_encoders.json").read_text(encoding="utf-8"))
    assert data["Merchant State"] == trained.preprocessor.classes_["Merchant State"].tolist()
