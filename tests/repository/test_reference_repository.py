"""The checked-in model_repository/ is current: regenerating it gives the same repository.

Regenerate with `make repository` when this fails after a deliberate change.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import xgboost as xgb

from triton_nb import fraud
from triton_nb.cli import main
from triton_nb.repository import validate_repository

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / "model_repository"


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and p.name != ".gitkeep" and "__pycache__" not in p.parts)


def test_checked_in_repository_is_current(tmp_path, capsys):
    assert main(["export", "--out", str(tmp_path / "fresh")]) == 0
    fresh = tmp_path / "fresh"
    assert _files(CHECKED_IN) == _files(fresh)
    assert validate_repository(CHECKED_IN) == []
    for name in _files(fresh):
        if name.endswith((".pbtxt", ".py", ".json")) and not name.endswith("xgboost.json"):
            assert (CHECKED_IN / name).read_bytes() == (fresh / name).read_bytes(), f"{name} is stale"
    classes = json.loads((CHECKED_IN / "preprocessing/1/label_encoders.json").read_text(encoding="utf-8"))
    assert classes == json.loads((fresh / "preprocessing/1/label_encoders.json").read_text(encoding="utf-8"))
    # Tree files may differ in float formatting across XGBoost builds; their predictions may not.
    rows = fraud.FraudPreprocessor.load_encoders(fresh / "preprocessing/1").transform(
        fraud.generate_transactions(2000, seed=9)
    )
    checked = xgb.Booster(model_file=str(CHECKED_IN / "fil/1/xgboost.json"))
    regenerated = xgb.Booster(model_file=str(fresh / "fil/1/xgboost.json"))
    np.testing.assert_allclose(checked.inplace_predict(rows), regenerated.inplace_predict(rows), rtol=1e-6)
