"""The checked-in model_repository/ is current: regenerating it gives the same repository.

Regenerate with `make repository` when this fails after a deliberate change. It runs
tools/reference_repository.py, as this test does: `triton-nb export`, then a header in each config
and Python file naming its source, and a README.md.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import xgboost as xgb

from triton_nb import fraud
from triton_nb.repository import validate_repository

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / "model_repository"


def _tool():
    spec = importlib.util.spec_from_file_location("reference_repository", ROOT / "tools" / "reference_repository.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and p.name != ".gitkeep" and "__pycache__" not in p.parts)


def test_checked_in_repository_is_current(tmp_path):
    tool = _tool()
    fresh = tool.write(tmp_path / "fresh")
    assert _files(CHECKED_IN) == _files(fresh)
    assert validate_repository(CHECKED_IN) == []
    for name in _files(fresh):
        if name.endswith((".pbtxt", ".py", ".json", ".md")) and not name.endswith("xgboost.json"):
            assert (CHECKED_IN / name).read_bytes() == (fresh / name).read_bytes(), f"{name} is stale"
        if name.endswith((".pbtxt", ".py")):  # every file that takes a comment says it is generated
            first_lines = (CHECKED_IN / name).read_text(encoding="utf-8").splitlines()[:2]  # after a shebang
            assert any(line.startswith(tool.HEADER_PREFIX) for line in first_lines), f"{name} has no header"
    classes = json.loads((CHECKED_IN / "preprocessing/1/label_encoders.json").read_text(encoding="utf-8"))
    assert classes == json.loads((fresh / "preprocessing/1/label_encoders.json").read_text(encoding="utf-8"))
    # Tree files may differ in float formatting across XGBoost builds; their predictions may not.
    rows = fraud.FraudPreprocessor.load_encoders(fresh / "preprocessing/1").transform(
        fraud.generate_transactions(2000, seed=9)
    )
    checked = xgb.Booster(model_file=str(CHECKED_IN / "fil/1/xgboost.json"))
    regenerated = xgb.Booster(model_file=str(fresh / "fil/1/xgboost.json"))
    np.testing.assert_allclose(checked.inplace_predict(rows), regenerated.inplace_predict(rows), rtol=1e-6)
