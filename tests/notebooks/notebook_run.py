"""How the tests run the notebooks: small parameters injected the way papermill does it (a cell tagged
``injected-parameters`` right after the one tagged ``parameters``), and cells of their own added to
the in-memory notebook; the files on disk are never changed. Execution is tools/execute_notebooks.py's
(`make notebooks`), so the tests run the notebooks the way their committed outputs were made."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"

# small sizes, for the parameters each notebook declares
SMALL = {"ROWS": 6000, "ROUNDS": 15, "MEASUREMENT_INTERVAL_MS": 300}

# the last cell of the notebooks that start a server
STOP_SERVER = "server.stop()"

# appended to every notebook: nothing left behind, no server, front-end or load thread
NO_THREADS_LEFT = """\
import threading

left = [t.name for t in threading.enumerate() if t.name.startswith("triton-nb")]
assert not left, left
print("server stopped; no threads left")"""


def _tool():
    spec = importlib.util.spec_from_file_location("execute_notebooks", ROOT / "tools" / "execute_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = _tool()


def read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / name, as_version=4)


def parameters_index(book: nbformat.NotebookNode) -> int:
    tagged = [i for i, cell in enumerate(book.cells) if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, f"expected one cell tagged 'parameters', found {len(tagged)}"
    return tagged[0]


def declared_parameters(book: nbformat.NotebookNode) -> dict[str, Any]:
    """The parameters cell's names and values: literal assignments only, nothing else."""
    tree = ast.parse(book.cells[parameters_index(book)].source)
    declared = {}
    for statement in tree.body:
        assert isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
            and isinstance(statement.targets[0], ast.Name), f"not a plain assignment: {ast.unparse(statement)}"
        declared[statement.targets[0].id] = ast.literal_eval(statement.value)
    return declared


def inject_parameters(book: nbformat.NotebookNode, values: dict[str, Any]) -> nbformat.NotebookNode:
    """Insert the papermill-style ``injected-parameters`` cell with those of ``values`` the notebook declares."""
    declared = declared_parameters(book)
    source = "# Parameters\n" + "".join(f"{name} = {value!r}\n" for name, value in values.items() if name in declared)
    book.cells.insert(parameters_index(book) + 1, new_code_cell(source, metadata={"tags": ["injected-parameters"]}))
    return book


def stop_cell_index(book: nbformat.NotebookNode) -> int:
    last = len(book.cells) - 1
    assert book.cells[last].cell_type == "code" and book.cells[last].source.strip() == STOP_SERVER, \
        f"the notebook's last cell is not {STOP_SERVER!r}: {book.cells[last].source!r}"
    return last


def without_outputs(book: nbformat.NotebookNode) -> nbformat.NotebookNode:
    for cell in book.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    book.metadata.pop("widgets", None)
    return book


def run(name: str, workdir: Path, before_stop: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    """Execute notebook ``name`` with small parameters and its WORK in ``workdir/work``; ``before_stop``:
    cells run just before its last, ``server.stop()``; the no-threads-left check runs after its last cell."""
    book = inject_parameters(read(name), {**SMALL, "WORK": str(workdir / "work")})
    if before_stop:
        index = stop_cell_index(book)
        book.cells[index:index] = [new_code_cell(source) for source in before_stop]
    book.cells.append(new_code_cell(NO_THREADS_LEFT))
    return tool.execute(book, workdir, timeout=300)
