"""Treelite's and TL2cgen's C++ log lines reach Python logging, not the console."""

from __future__ import annotations

import logging
import os
import threading
import uuid

import numpy as np
import xgboost as xgb

from triton_nb import _native_logs
from triton_nb.backends.base import ModelContext
from triton_nb.backends.fil import FilBackend
from triton_nb.repository.config import effective_config, load_config
from triton_nb.repository.export import export_tree_model

NATIVE = "triton_nb.native"


def _native_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith(NATIVE)]


def test_a_fil_model_compiled_in_the_background_prints_nothing(tmp_path, monkeypatch, capfd, caplog):
    # 40 trees: tl2cgen splits them into translation units and logs that (split.cc) on the
    # compiling thread, where the Python package's own callback is not registered
    monkeypatch.setenv("TRITON_NB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TRITON_NB_FIL_COMPILE", raising=False)
    rng = np.random.default_rng(0)
    x = rng.random((400, 5), dtype=np.float32)
    model = xgb.XGBClassifier(n_estimators=40, max_depth=3, n_jobs=2).fit(x, x[:, 0] > 0.5)
    folder = export_tree_model(model, tmp_path / "repo", name="trees")
    config = effective_config(load_config(folder), "trees")
    context = ModelContext(name="trees", version=1, config=config, model_path=folder, version_path=folder / "1",
                           repository_path=folder.parent, instance_name="trees_0", instance_kind="KIND_CPU")
    caplog.set_level(logging.DEBUG, logger=NATIVE)
    capfd.readouterr()
    loaded: list[FilBackend] = []
    # loaded on a thread of its own, as the server's model manager does
    loader = threading.Thread(target=lambda: loaded.append(FilBackend(context, compile=True)))
    loader.start()
    loader.join(timeout=120)
    assert loaded, "the model did not load"
    backend = loaded[0]
    try:
        assert backend.wait_compiled(timeout_s=300), backend.compile_state
    finally:
        backend.finalize()
    out, err = capfd.readouterr()
    assert ".cc:" not in out and ".cc:" not in err, (out, err)
    messages = [r.getMessage() for r in _native_records(caplog)]
    assert any("Parallel compilation enabled" in m for m in messages), messages
    assert all(r.levelno == logging.DEBUG for r in _native_records(caplog))


def test_the_version_skew_note_is_logged_once_per_process(caplog):
    caplog.set_level(logging.DEBUG, logger=NATIVE)
    token = uuid.uuid4().hex  # a note no earlier test of this process can have logged
    note = (f"[10:11:12] /src/serializer.cc:202: The model you are loading originated from a newer Treelite version; "
            f"some functionalities may be unavailable.\nCurrently running Treelite version {token}\n")
    logger = logging.getLogger(f"{NATIVE}.tl2cgen")
    for _ in range(3):
        _native_logs._log_record(logger, note)
    _native_logs._log_record(logger, "[10:11:12] /src/split.cc:35: Parallel compilation enabled")
    _native_logs._log_record(logger, "[10:11:13] /src/split.cc:35: Parallel compilation enabled")
    messages = [r.getMessage() for r in _native_records(caplog)]
    assert sum(token in m for m in messages) == 1
    assert messages.count("/src/split.cc:35: Parallel compilation enabled") == 2  # others each time, no timestamp


def test_captured_stderr_logs_the_library_and_gives_the_rest_back(capfd, caplog):
    caplog.set_level(logging.DEBUG, logger=NATIVE)
    token = uuid.uuid4().hex
    capfd.readouterr()
    with _native_logs.native_stderr_to_logging("tl2cgen"):
        os.write(2, f"[10:11:12] /src/serializer.cc:202: Treelite version note {token}\n".encode())
        os.write(2, f"Currently running Treelite version {token}\n".encode())
        os.write(2, b"another thread's own line\n")
    _, err = capfd.readouterr()
    assert err == "another thread's own line\n"  # not lost, and the library's lines are not on it
    (record,) = [r for r in _native_records(caplog) if token in r.getMessage()]
    assert record.name == f"{NATIVE}.tl2cgen" and record.levelno == logging.DEBUG
    assert record.getMessage().splitlines() == [f"/src/serializer.cc:202: Treelite version note {token}",
                                                f"Currently running Treelite version {token}"]

