"""The server's arrows point down: nothing under ``triton_nb/server/`` imports the layers built on it,
and the front ends, the client and perf reach the server through its service interface only.

Imports inside functions and under ``TYPE_CHECKING`` count: they are arrows too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "triton_nb"
ABOVE_THE_SERVER = ("triton_nb.client", "triton_nb.perf", "triton_nb.notebook", "triton_nb.serving",
                    "triton_nb.widgets", "triton_nb.cli", "triton_nb.demo")
THROUGH_THE_SERVICE = ("server/http.py", "server/grpc.py", "server/network.py", "client.py", "perf/load.py")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever the import statement stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("path", sorted((PACKAGE / "server").glob("*.py")), ids=lambda p: p.name)
def test_nothing_under_server_imports_the_layers_above(path):
    upward = sorted(m for m in _imports(path) if m.startswith(ABOVE_THE_SERVER) or m == "triton_nb")
    assert not upward, f"{path.name} imports {upward}"


@pytest.mark.parametrize("relative", THROUGH_THE_SERVICE)
def test_front_ends_client_and_perf_import_the_service_not_the_core(relative):
    imports = _imports(PACKAGE / relative)
    assert not any(m.startswith("triton_nb.server.core") for m in imports), relative
