"""Fixtures of the perf tests."""

from __future__ import annotations

import importlib

import pytest

from tests.helpers.tune_fakes import FakeTarget


@pytest.fixture
def fake_loads(monkeypatch):
    """Loads on a FakeTarget come from its formulas (where measure looks open_load up)."""
    measure_module = importlib.import_module("triton_nb.perf.measure")  # the package's `measure` is the function
    real = measure_module.open_load

    def open_load(transport, model, requests, concurrency=None, **level):
        if isinstance(transport, FakeTarget):
            return transport.make_load(concurrency)
        return real(transport, model, requests, concurrency=concurrency, **level)

    monkeypatch.setattr(measure_module, "open_load", open_load)
