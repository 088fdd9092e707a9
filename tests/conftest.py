"""Test-wide set-up: one small trained fraud model shared by every test that needs one, and a guard
on tritonclient.http's destructor (below). The helper modules are the package tests/helpers
(``from tests.helpers.real_triton import ...``), importable because pyproject.toml's pytest
``pythonpath`` puts the repository root on sys.path."""

from __future__ import annotations

import pytest
import tritonclient.http as httpclient

_client_del = httpclient.InferenceServerClient.__del__


def _client_del_outside_gevent(self: httpclient.InferenceServerClient) -> None:
    """tritonclient.http's client closes itself in ``__del__`` through gevent, which needs the
    current thread's gevent state. When the garbage collector happens to free a client while some
    other thread is being torn down, that state is already gone and gevent raises
    ``AttributeError: '_Threadlocal' object has no attribute ...`` (gevent issue 1961): an unraisable
    exception that fails whichever test is running, though nothing was lost (the client's sockets
    close with their own objects). Only that error is passed over; any other still fails the test."""
    try:
        _client_del(self)
    except AttributeError as error:
        if "_Threadlocal" not in str(error):
            raise


httpclient.InferenceServerClient.__del__ = _client_del_outside_gevent


@pytest.fixture(scope="session")
def fraud_frame():
    from triton_nb import fraud

    return fraud.generate_transactions(8000, seed=2, fraud_rate=0.05)


@pytest.fixture(scope="session")
def trained(fraud_frame):
    from triton_nb import fraud

    return fraud.train_fraud_model(fraud_frame, num_boost_round=25, early_stopping_rounds=None, progress=False,
                                   nthread=2)
