"""Python-backend models whose sibling is a package with submodules (as the exported preprocessing
ships ``fraud_encoding/``): each model answers with its own package, submodules included, when
several are served in one server or in servers side by side in one process."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from triton_nb import fraud, serve
from triton_nb.errors import InvalidArgumentError
from triton_nb.repository import export_fraud_repository

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [{{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }}]
output [{{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }}]
"""

# helper/__init__.py is the same in every model; only the submodules differ. The answer reads
# the package, a submodule it imported relatively, one the model imports at load and one
# imported only inside execute.
MODEL = """
import helper
from helper.tables import factor
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        from helper.late import LATE  # a submodule first imported here, after loading
        value = helper.VALUE * 1000 + helper.rules.RULE * 100 + factor() * 10 + LATE
        out = []
        for request in requests:
            x = request.inputs()[0].as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 0 + value)]))
        return out
"""

HELPER_INIT = """
from . import rules
from .rules import VALUE
"""


def write_model(root: Path, name: str, digit: int) -> None:
    """A model answering ``digit`` in each of four places, each from a file of its helper package."""
    version = root / name / "1"
    (version / "helper").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(name=name)), encoding="utf-8")
    files = {
        "model.py": MODEL,
        "helper/__init__.py": HELPER_INIT,
        "helper/rules.py": f"VALUE = {digit}\nRULE = {digit}\n",
        "helper/tables.py": f"def factor():\n    return {digit}\n",
        "helper/late.py": f"LATE = {digit}\n",
    }
    for path, text in files.items():
        (version / path).write_text(textwrap.dedent(text), encoding="utf-8")


def answer(server, name: str) -> float:
    result = server.client().infer(name, {"X": np.zeros((1, 1), np.float32)})
    return float(result.as_numpy("Y")[0, 0])


def helper_modules() -> list[str]:
    return [name for name in sys.modules if name.partition(".")[0] == "helper"]


def test_models_of_one_server_keep_their_own_package_and_submodules(tmp_path):
    write_model(tmp_path, "model_a", 1)
    write_model(tmp_path, "model_b", 2)
    with serve(tmp_path) as server:
        for _ in range(2):  # the second time, the submodule imported in execute is the kept one
            assert (answer(server, "model_a"), answer(server, "model_b")) == (1111.0, 2222.0)
        assert helper_modules() == []
    assert helper_modules() == []


def test_servers_side_by_side_keep_their_own_package_and_submodules(tmp_path):
    # Two repositories with a model of the same name, as two exported repositories have.
    write_model(tmp_path / "first", "model", 3)
    write_model(tmp_path / "second", "model", 4)
    with serve(tmp_path / "first") as first, serve(tmp_path / "second") as second:
        for _ in range(2):
            assert (answer(first, "model"), answer(second, "model")) == (3333.0, 4444.0)
        assert helper_modules() == []


def test_exported_repositories_side_by_side_use_their_own_fraud_encoding(tmp_path):
    # The second repository's fraud_encoding differs in one submodule, in the message of an
    # error only it raises: each server's preprocessing must answer with its own package's.
    frame = fraud.generate_transactions(3000, seed=2)
    model = fraud.train_fraud_model(frame, num_boost_round=3, early_stopping_rounds=None, progress=False, nthread=1)
    first = export_fraud_repository(model, tmp_path / "first")
    second = export_fraud_repository(model, tmp_path / "second")
    numeric = second / "preprocessing" / "1" / "fraud_encoding" / "numeric.py"
    source = numeric.read_text(encoding="utf-8")
    assert source.count("has non-numeric value(s)") == 1
    numeric.write_text(source.replace("has non-numeric value(s)", "has non-numeric value(s) [second]"),
                       encoding="utf-8")
    rows = frame.head(5)
    bad = fraud.request_tensors(rows)
    bad["Amount"] = np.full((5, 1), b"abc", dtype=object)
    only_preprocessing = {"model_control_mode": "explicit", "load_models": ["preprocessing"]}
    with serve(first, **only_preprocessing) as one, serve(second, **only_preprocessing) as other:
        for server in (one, other):
            features = server.client().infer("preprocessing", rows).as_numpy("OUTPUT")
            np.testing.assert_array_equal(features, model.preprocessor.transform(rows))
        for _ in range(2):
            with pytest.raises(InvalidArgumentError) as plain:
                one.client().infer("preprocessing", bad)
            with pytest.raises(InvalidArgumentError) as marked:
                other.client().infer("preprocessing", bad)
            assert "column 'Amount' has non-numeric value(s): 'abc'" in str(plain.value)
            assert "column 'Amount' has non-numeric value(s) [second]: 'abc'" in str(marked.value)
    assert [name for name in sys.modules if name.partition(".")[0] == "fraud_encoding"] == []
