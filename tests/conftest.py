"""Test-wide set-up: make the helper modules in tests/ (real_triton.py) importable everywhere."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
