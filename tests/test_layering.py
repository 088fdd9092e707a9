"""The package's arrows point down: every module imports only its own layer and the layers below
(README, "Architecture"), with the one exception named below; and the front ends, the client,
the transports and perf reach the server through its service interface only.

Imports inside functions and under ``TYPE_CHECKING`` count: they are arrows too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "triton_nb"

# Lowest first. A module may import its own layer and any layer below it.
LAYERS = (
    ("triton_nb._version", "triton_nb.errors", "triton_nb._deprecation", "triton_nb._optional",
     "triton_nb._native_logs", "triton_nb._locks", "triton_nb._sockets", "triton_nb.tritonserver"),
    ("triton_nb.tensors", "triton_nb.frames"),
    ("triton_nb.fraud",),
    ("triton_nb.repository",),
    ("triton_nb.backends",),
    ("triton_nb.server",),
    ("triton_nb.client",),
    ("triton_nb.transport",),
    ("triton_nb.perf",),
    ("triton_nb.notebook",),
    ("triton_nb.serving", "triton_nb.widgets", "triton_nb"),
    ("triton_nb.demo", "triton_nb.cli"),
)
# (importer, imported): the arrows that may run up, each for the reason in a comment at the import.
EXCEPTIONS = {
    # %triton start hands the user the public InferenceServer (with client() and tune()), which is
    # built on the notebook's panel; imported when the magic runs.
    ("triton_nb.notebook.magics", "triton_nb.serving"),
}
THROUGH_THE_SERVICE = ("server/frontends/http/app.py", "server/frontends/grpc/servicer.py",
                       "server/frontends/network.py", "client.py", "transport.py", "perf/load.py")
# Inside the server the front ends reach the rest of it through the service interface: of the server's
# modules they import only these (and each other), never core, models/ or scheduling/.
FRONTENDS = "triton_nb.server.frontends"
FRONTENDS_MAY_IMPORT = ("triton_nb.server.service", "triton_nb.server.observability.logs", FRONTENDS)
FRONTEND_MODULES = sorted((PACKAGE / "server" / "frontends").rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    relative = Path(*name.split("."))
    return (PACKAGE.parent / relative.with_suffix(".py")).is_file() or (PACKAGE.parent / relative).is_dir()


def _imports(path: Path) -> set[str]:
    """Every triton_nb module ``path`` imports, wherever the import statement stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # ``from triton_nb import fraud`` imports the module triton_nb.fraud
                name = f"{node.module}.{alias.name}"
                found.add(name if _is_module(name) else node.module)
    return {name for name in found if name == "triton_nb" or name.startswith("triton_nb.")}


def _layer(module: str) -> int:
    best, depth = None, -1
    for index, members in enumerate(LAYERS):
        for member in members:
            # the longest prefix decides: "triton_nb.server.core" is in "triton_nb.server", not "triton_nb"
            if (module == member or module.startswith(member + ".")) and member.count(".") > depth:
                best, depth = index, member.count(".")
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "templates" not in p.parts)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_down(path):
    importer = _module_name(path)
    upward = sorted(m for m in _imports(path)
                    if _layer(m) > _layer(importer) and (importer, m) not in EXCEPTIONS)
    assert not upward, f"{importer} (layer {_layer(importer)}) imports {upward} from above"


def test_the_exceptions_are_still_needed():
    """An exception whose import went away is taken off the list."""
    for importer, imported in EXCEPTIONS:
        path = PACKAGE.parent / (importer.replace(".", "/") + ".py")
        assert imported in _imports(path), f"{importer} no longer imports {imported}: drop the exception"


@pytest.mark.parametrize("relative", THROUGH_THE_SERVICE)
def test_front_ends_client_and_perf_import_the_service_not_the_core(relative):
    imports = _imports(PACKAGE / relative)
    assert not any(m.startswith("triton_nb.server.core") for m in imports), relative


@pytest.mark.parametrize("path", FRONTEND_MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_front_ends_import_no_more_of_the_server_than_the_service(path):
    server = {m for m in _imports(path) if m == "triton_nb.server" or m.startswith("triton_nb.server.")}
    beyond = sorted(m for m in server
                    if not any(m == allowed or m.startswith(allowed + ".") for allowed in FRONTENDS_MAY_IMPORT))
    assert not beyond, f"{_module_name(path)} imports {beyond}: the front ends reach the server through its service"
