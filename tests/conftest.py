"""Test-wide set-up: the helper modules in tests/ (real_triton.py) importable everywhere, and one
small trained fraud model shared by every test that needs one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def fraud_frame():
    from triton_nb import fraud

    return fraud.generate_transactions(8000, seed=2, fraud_rate=0.05)


@pytest.fixture(scope="session")
def trained(fraud_frame):
    from triton_nb import fraud

    return fraud.train_fraud_model(fraud_frame, num_boost_round=25, early_stopping_rounds=None, progress=False,
                                   nthread=2)
