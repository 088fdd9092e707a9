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
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# the top-level modules the extras install (and pyarrow, which only [dask] brings)
OPTIONAL_MODULES = {"dask", "distributed", "lightgbm", "onnx", "onnxmltools", "skl2onnx", "onnxruntime", "boto3",
                    "botocore", "pyarrow", "cudf", "cuml", "cupy"}
# the extras that group others or add tools, not a feature of the package
GROUPS = {"all", "dev", "docs"}


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


def test_import_does_not_touch_gpu_libraries_or_the_extras():
    # what `import triton_nb` and the core modules load must not include an extra's package:
    # without the extra, the import would fail (tests/test_light_install.py runs the journey so)
    code = (
        "import sys, triton_nb, triton_nb.fraud, triton_nb.cli, triton_nb.serving, triton_nb.repository\n"
        "import triton_nb.perf, triton_nb.transport, triton_nb.backends.onnxruntime, triton_nb.backends.fil\n"
        # pandas imports pyarrow by its own choice when it is there (tests/test_light_install.py blocks it)
        f"optional = [m for m in {sorted(OPTIONAL_MODULES - {'pyarrow'})!r} if m in sys.modules]\n"
        "assert not optional, optional\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


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


def _extra_names(extra: str) -> set[str]:
    """The distributions an extra installs, its own ``triton-nb[...]`` references followed."""
    names: set[str] = set()
    for requirement in PROJECT["optional-dependencies"][extra]:
        name = _requirement_name(requirement)
        if name == "triton-nb":
            for inner in re.search(r"\[(.*)\]", requirement).group(1).split(","):
                names |= _extra_names(inner.strip())
        else:
            names.add(name)
    return names


def test_core_dependencies_leave_every_extra_out():
    core = set(map(_requirement_name, PROJECT["dependencies"]))
    for extra in set(PROJECT["optional-dependencies"]) - GROUPS:
        assert not core & _extra_names(extra), f"core also lists [{extra}]'s {sorted(core & _extra_names(extra))}"
    assert not core & {"dask", "distributed", "lightgbm", "onnx", "onnxmltools", "skl2onnx", "onnxruntime",
                       "boto3", "pyarrow"}
    # tritonclient's HTTP and gRPC clients only: its [all] adds cuda-python and perf-analyzer
    assert "tritonclient[http,grpc]>=2.50" in PROJECT["dependencies"]


def test_all_has_every_extra_but_gpu_and_dev_has_all():
    features = set(PROJECT["optional-dependencies"]) - GROUPS
    assert features == {"dask", "lightgbm", "onnx", "sagemaker", "gpu"}
    everything = _extra_names("all")
    for extra in features - {"gpu"}:
        assert _extra_names(extra) <= everything, extra
    # cudf-cu12 and cuml-cu12 install only on a CUDA 12 machine, so [all] (and [dev]) leave [gpu] out
    assert not _extra_names("gpu") & everything
    assert everything <= _extra_names("dev")


def test_versions_table_mirrors_pyproject():
    from triton_nb import _versions

    assert {name.replace("_", "-") for name in _versions.CORE_PACKAGES} == set(
        map(_requirement_name, PROJECT["dependencies"]))
    assert {extra.name: {p.replace("_", "-") for p in extra.packages} for extra in _versions.EXTRAS} == {
        extra: _extra_names(extra) for extra in set(PROJECT["optional-dependencies"]) - GROUPS}
    # every module require_module knows names one of those extras
    assert set(triton_nb._optional._EXTRAS.values()) <= {extra.name for extra in _versions.EXTRAS}
    assert set(triton_nb._optional._EXTRAS) <= OPTIONAL_MODULES


def _installed_closure(requirements: list[str]) -> set[str]:
    """Every distribution that installing ``requirements`` brings, read from the installed metadata
    (markers evaluated here, extras followed)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements]
    visited: set[tuple[str, str]] = set()
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = requirement.name.lower().replace("_", "-")
        key = (name, ",".join(sorted(requirement.extras)))
        if key in visited:
            continue
        visited.add(key)
        seen.add(name)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue
        if name == "triton-nb":  # this checkout's extras, not those of the installed copy's metadata
            requires = PROJECT["dependencies"] + [
                f"{r}; extra == '{e}'" if ";" not in r else r
                for e in PROJECT["optional-dependencies"] for r in PROJECT["optional-dependencies"][e]]
        for inner in requires:
            parsed = Requirement(inner)
            for wanted in requirement.extras or {""}:
                todo.append((parsed, wanted))
    return seen


def test_dev_installs_every_package_the_tests_import():
    import ast
    from importlib import metadata

    modules: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.partition(".")[0])
    providers = metadata.packages_distributions()
    gpu = {"cudf", "cuml", "cupy"}
    needed = {providers[m][0].lower().replace("_", "-") for m in modules - gpu - set(sys.stdlib_module_names)
              if m in providers}
    assert {"pytest", "dask", "lightgbm", "onnx", "boto3"} <= needed  # the walk found the tests' imports
    installed = _installed_closure(["triton-nb[dev]"])
    missing = needed - installed
    assert not missing, f"tests import packages that `pip install -e '.[dev]'` does not install: {sorted(missing)}"


def test_show_versions_prints_python_core_and_each_extra(capsys, monkeypatch):
    from triton_nb import _versions

    monkeypatch.setattr(_versions, "EXTRAS", (*_versions.EXTRAS, _versions.Extra(
        "phantom", "nothing real", ("definitely-not-installed-xyz",))))
    triton_nb.show_versions()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["triton_nb", triton_nb.__version__]
    assert lines[1].startswith(f"Python       {sys.version_info.major}.{sys.version_info.minor}.")
    assert any(line.split() == ["xgboost", metadata_version("xgboost")] for line in lines)
    for name in _versions.CORE_PACKAGES:
        assert sum(line.split()[:1] == [name] for line in lines) == 1, name
    for extra in _versions.EXTRAS[:-1]:
        header = next(line for line in lines if line.startswith(f"[{extra.name}] "))
        assert header.endswith(f"pip install 'triton-nb[{extra.name}]'"), header
    assert "[phantom] nothing real: not installed; pip install 'triton-nb[phantom]'" in lines
    assert any(line.split() == ["definitely-not-installed-xyz", "not", "installed"] for line in lines)
    assert "show_versions" in triton_nb.__all__ and "show_versions" in dir(triton_nb)


def metadata_version(name: str) -> str:
    from importlib import metadata

    return metadata.version(name)
