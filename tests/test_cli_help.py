"""Every ``triton-nb`` command's ``--help``, snapshotted: a change to a flag, a default or a help text
shows in review as a change to ``tests/data/cli_help/<command>.txt``.

After a deliberate change, write the snapshots again with
``TRITON_NB_UPDATE_HELP=1 python -m pytest tests/test_cli_help.py`` and review the diff.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "data" / "cli_help"
COMMANDS = ["", "demo", "generate", "train", "export", "validate", "serve", "perf", "tune"]


def _help(command: str) -> str:
    argv = [sys.executable, "-m", "triton_nb.cli", *([command] if command else []), "--help"]
    # a fixed width: argparse wraps the help to the terminal's
    environment = {**os.environ, "COLUMNS": "100"}
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c or "triton-nb")
def test_help_matches_its_snapshot(command: str) -> None:
    text = _help(command)
    snapshot = SNAPSHOTS / f"{command or 'triton-nb'}.txt"
    if os.environ.get("TRITON_NB_UPDATE_HELP") == "1":
        snapshot.write_text(text, encoding="utf-8")
    assert snapshot.is_file(), f"no snapshot for '{command}': run with TRITON_NB_UPDATE_HELP=1"
    assert text == snapshot.read_text(encoding="utf-8")


def test_help_reads_as_a_shell_tools() -> None:
    text = _help("")
    assert "``" not in text and "Train, export, serve and tune" in text  # no reST leaking into the terminal
    assert all("None" not in _help(command) for command in ("serve", "perf", "tune"))  # no Python values shown
    version = subprocess.run([sys.executable, "-m", "triton_nb.cli", "--version"], capture_output=True, text=True,
                             cwd=ROOT, timeout=60)
    assert version.stdout.strip().startswith("triton-nb ") and version.returncode == 0
