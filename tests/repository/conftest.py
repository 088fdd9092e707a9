"""Shared fixtures: one small trained fraud model for the export tests."""

from __future__ import annotations

import pytest

from triton_nb import fraud


@pytest.fixture(scope="session")
def fraud_frame():
    return fraud.generate_transactions(8000, seed=2, fraud_rate=0.05)


@pytest.fixture(scope="session")
def trained(fraud_frame):
    return fraud.train_fraud_model(fraud_frame, num_boost_round=25, early_stopping_rounds=None, progress=False,
                                   nthread=2)
