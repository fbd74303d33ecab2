"""Every notebook in notebooks/ runs top to bottom, headless, without an error."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from procs import SLOWNESS, TEST_JAVA_OPTIONS

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))

# Each notebook runs in a Jupyter kernel: a child process.
pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(600)]


def _kernel_env() -> None:
    # The kernel is this interpreter (the venv's), so it imports the same sparkmq; Spark workers too.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def run_notebook(notebook: Any, cwd: Path, timeout: int = 300) -> list[str]:
    """Run every cell of ``notebook`` (in place) and return one report per cell that failed or never ran; a cell
    may take ``timeout`` s (times the day's :data:`procs.SLOWNESS`).

    The client does not stop at the first error (``allow_errors``), so the errors come from the outputs
    the kernel recorded: nothing else decides whether the notebook passed.
    """
    _kernel_env()
    # The kernel's JVMs on C1, as the tests' services are: A B A B on one day, this file used 505 and 544 s of CPU
    # by default, 383 and 382 s with it.
    kernel_env = dict(os.environ, JDK_JAVA_OPTIONS=TEST_JAVA_OPTIONS)
    NotebookClient(notebook, timeout=int(timeout * SLOWNESS), kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(cwd)}}).execute(env=kernel_env)
    problems = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        if cell.get("execution_count") is None:
            problems.append(f"cell {index} never ran:\n{cell.source}")
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                trace = "\n".join(out.get("traceback", []))
                problems.append(f"cell {index} raised {out.get('ename')}: {out.get('evalue')}\n{cell.source}\n{trace}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path, tmp_path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    problems = run_notebook(notebook, tmp_path)
    assert not problems, f"{path.name}:\n\n" + "\n\n".join(problems)


def test_a_failing_cell_fails_the_check(tmp_path: Path) -> None:
    """The check above can fail: a notebook whose second cell raises is reported, and later cells still run."""
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("raise ValueError('broken on purpose')"),
        nbformat.v4.new_code_cell("y = x + 1"),
    ])
    problems = run_notebook(notebook, tmp_path, timeout=60)
    assert len(problems) == 1 and problems[0].startswith("cell 1 raised ValueError: broken on purpose"), problems
    assert notebook.cells[2].execution_count is not None
