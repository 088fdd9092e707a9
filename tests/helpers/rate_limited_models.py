"""Two held models that compete for one rate limiter resource, for triton_nb and for real Triton."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.scale_models import GATED_MODEL, write_python_model

HELD_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU
                   rate_limiter {{ resources [ {{ name: "R" count: 1 {scope} }} ] priority: 1 }} }} ]
"""


def write_held_models(repo: Path, names: tuple[str, ...] = ("held_a", "held_b"), *, is_global: bool = False
                      ) -> dict[str, Path]:
    """Models that each need one copy of resource R; each batch marks 'running' in its folder and is
    held until the test creates 'open' there (the gated model's code)."""
    scope = "global: true" if is_global else ""
    return {name: write_python_model(repo, name, HELD_CONFIG.format(name=name, scope=scope), GATED_MODEL)
            for name in names}
