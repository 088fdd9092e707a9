"""Execute the notebooks in notebooks/ in order, in place, with their default parameters (`make notebooks`).

Each runs on a fresh kernel whose working folder is a temporary one, so their WORK folder (data, model,
repositories) never lands in the repository. The outputs are written into the .ipynb files, and each
notebook's metadata gets the SHA-256 of its code cells (``metadata.triton_nb.code_sha256``):
tests/notebooks/test_committed_outputs.py checks that both are current.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def code_sha256(book: nbformat.NotebookNode) -> str:
    """The SHA-256 of the code cells' sources, in order (markdown cells may change freely)."""
    sources = [cell.source for cell in book.cells if cell.cell_type == "code"]
    return hashlib.sha256(json.dumps(sources).encode()).hexdigest()


def execute(book: nbformat.NotebookNode, cwd: Path, timeout: int | None = None) -> nbformat.NotebookNode:
    """Run every cell on a fresh kernel started in ``cwd``; no timing metadata, no widget state."""
    NotebookClient(book, timeout=timeout, kernel_name="python3", record_timing=False, store_widget_state=False,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return book


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="triton-nb-notebooks-") as work:
        for path in notebooks():
            started = time.monotonic()
            book = execute(nbformat.read(path, as_version=4), Path(work))
            book.metadata.setdefault("triton_nb", {})["code_sha256"] = code_sha256(book)
            nbformat.write(book, path)
            print(f"{path.name}: {time.monotonic() - started:.0f} s, {path.stat().st_size / 1e3:.0f} kB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
