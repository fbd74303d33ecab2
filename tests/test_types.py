"""The product type-checks: mypy over platform/, api/ and pipelines/ as pyproject.toml's [tool.mypy] says."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: mypy_path of [tool.mypy]: the repository root is the package ``sparkmq`` (pyproject's package-dir), which mypy
#: cannot find through the editable install's import hook, so it finds it here, as a link to the root.
MYPY_PATH = ROOT / "var" / "mypy"


def _link_package() -> None:
    MYPY_PATH.mkdir(parents=True, exist_ok=True)
    link = MYPY_PATH / "sparkmq"
    if link.is_symlink() and link.resolve() == ROOT:
        return
    if link.is_symlink():
        link.unlink()  # a moved checkout's link
    try:
        link.symlink_to(os.path.relpath(ROOT, MYPY_PATH), target_is_directory=True)
    except FileExistsError:  # made meanwhile by another run
        pass


def test_mypy_passes_over_the_product() -> None:
    _link_package()
    # The packages, strictness and cache (var/mypy-cache: a warm run takes seconds) all come from pyproject.toml.
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"mypy found errors:\n{result.stdout}{result.stderr}"
    assert "Success: no issues found" in result.stdout, result.stdout + result.stderr
