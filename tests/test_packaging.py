"""Packaging facts: public API, optional imports, environment.yml, README commands."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import tomllib

import triton_nb
import triton_nb._optional
import triton_nb.backends.fil
from triton_nb._optional import optional_module, require_module
from triton_nb.errors import MissingDependencyError

ROOT = Path(__file__).resolve().parents[1]


def _requirement_name(requirement: str) -> str:
    # PEP 503 normalisation: conda-forge spells some names with "_" where PyPI has "-"
    return re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def test_every_core_dependency_is_in_environment_yml():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    environment = (ROOT / "environment.yml").read_text()
    listed = {
        _requirement_name(line.strip().lstrip("- ").strip())
        for line in environment.splitlines()
        if line.strip().startswith("- ") and not line.strip().startswith("# ")
    }
    missing = [dep for dep in map(_requirement_name, project["dependencies"]) if dep not in listed]
    assert not missing, f"environment.yml lacks core dependencies: {missing}"
    assert "gpu" in project["optional-dependencies"] and "dev" in project["optional-dependencies"]


def test_public_api_is_explicit():
    for module in (triton_nb, triton_nb.fraud, triton_nb.backends.fil):
        assert module.__all__, module.__name__
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_subpackages_load_on_first_use_and_names_that_left_the_api_warn():
    code = ("import sys, triton_nb\n"
            "assert 'triton_nb.perf' not in sys.modules\n"
            "assert callable(triton_nb.perf.measure) and 'triton_nb.perf' in sys.modules\n"
            "assert 'perf' in dir(triton_nb)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    with pytest.raises(AttributeError, match="no attribute 'perff'"):
        triton_nb.perff  # noqa: B018 - the attribute access is the test
    moved = {"DEFAULT_NUM_BOOST_ROUND": "triton_nb.fraud.train", "resolve_device": "triton_nb.fraud.train",
             "US_STATE_CODES": "triton_nb.fraud.data"}
    for name, home in moved.items():
        assert name not in triton_nb.fraud.__all__
        with pytest.warns(DeprecationWarning, match=f"import it from {home}"):
            getattr(triton_nb.fraud, name)


def test_every_data_file_in_the_package_is_declared_package_data():
    # setuptools puts only .py files in the wheel unless [tool.setuptools.package-data] names the
    # others, and an installed package without them fails where it reads them (the FIL shim: at compile)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {path for package, patterns in declared.items() for pattern in patterns
               for path in ROOT.joinpath(*package.split(".")).glob(pattern)}
    data = {path for path in (ROOT / "triton_nb").rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts}
    assert ROOT / "triton_nb" / "backends" / "fil" / "triton_nb_shim.c" in data
    assert not data - shipped, f"not declared as package data: {sorted(map(str, data - shipped))}"
    shim = resources.files("triton_nb.backends.fil").joinpath("triton_nb_shim.c")
    assert shim.is_file() and "triton_nb_predict" in shim.read_text(encoding="utf-8")


def test_import_does_not_touch_gpu_libraries():
    code = (
        "import sys, triton_nb, triton_nb.fraud, triton_nb.cli\n"
        "gpu = [m for m in ('cudf', 'cuml', 'cupy', 'onnxruntime') if m in sys.modules]\n"
        "assert not gpu, gpu\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_optional_dependency_names_the_extra(monkeypatch):
    assert optional_module("definitely_not_a_module_xyz") is None
    monkeypatch.setitem(triton_nb._optional._EXTRAS, "definitely_not_a_module_xyz", "gpu")
    with pytest.raises(MissingDependencyError, match=r"GPU preprocessing.*pip install 'triton-nb\[gpu\]'"):
        require_module("definitely_not_a_module_xyz", "GPU preprocessing")


def test_readme_has_the_two_commands_and_ci_calls_the_test_one():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^make (demo|test)$", readme, flags=re.MULTILINE)
    assert set(commands) == {"demo", "test"}
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "triton-nb demo" in makefile
