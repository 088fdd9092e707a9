"""The notebooks are committed with their outputs (`make notebooks`: tools/execute_notebooks.py), so
that GitHub and the docs site show them: each notebook's code is still the code that made them (the
SHA-256 stamped in its metadata) and every code cell ran, in order, without an error. Clearing a cell's
outputs, in JupyterLab or with nbconvert, clears its execution count too."""

from __future__ import annotations

import nbformat
import pytest

from tests.notebooks.notebook_run import tool

RERUN = "run `make notebooks`"


def test_the_five_notebooks():
    assert [path.name for path in tool.notebooks()] == [
        "01_train_fraud_model.ipynb", "02_export_model_repository.ipynb", "03_serve_and_infer.ipynb",
        "04_tune_batching.ipynb", "05_stateful_model.ipynb"]


@pytest.mark.parametrize("path", tool.notebooks(), ids=lambda path: path.stem)
def test_outputs_are_current(path):
    book = nbformat.read(path, as_version=4)
    stamp = book.metadata.get("triton_nb", {}).get("code_sha256")
    assert stamp, f"{path.name} has no outputs stamp: {RERUN}"
    assert stamp == tool.code_sha256(book), f"{path.name}: its code changed since its outputs were made: {RERUN}"
    code = [cell for cell in book.cells if cell.cell_type == "code"]
    counts = [cell.execution_count for cell in code]
    assert counts == list(range(1, len(code) + 1)), \
        f"{path.name}: not every code cell ran, in order (execution counts {counts}): {RERUN}"
    errors = [output.get("ename") for cell in code for output in cell.outputs if output.output_type == "error"]
    assert not errors, f"{path.name}: cells failed ({errors}): {RERUN}"
    assert any(cell.outputs for cell in code), f"{path.name} has no outputs: {RERUN}"
