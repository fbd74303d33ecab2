"""Under CI=true a missing dependency fails the test that needs it; elsewhere it skips (conftest.need_module)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

NEEDS_A_MISSING_MODULE = (
    "from conftest import need_module\n\n"
    "def test_needs_it():\n    need_module('sparkmq_no_such_module')\n\n"
    "def test_has_it():\n    assert need_module('json').dumps(1) == '1'\n")


@pytest.mark.parametrize(("ci", "summary"), [("true", "1 failed, 1 passed"), ("", "1 passed, 1 skipped")])
def test_a_missing_module_fails_under_ci_and_skips_elsewhere(tmp_path: Path, ci: str, summary: str) -> None:
    (tmp_path / "test_work.py").write_text(NEEDS_A_MISSING_MODULE)
    env = {**os.environ, "CI": ci, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider",
                           f"--rootdir={tmp_path}", str(tmp_path / "test_work.py")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert summary in proc.stdout, proc.stdout + proc.stderr
    if ci:
        assert "sparkmq_no_such_module is needed under CI" in proc.stdout, proc.stdout
