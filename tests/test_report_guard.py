"""The report guard (``report_guard.py``): a failure pytest cannot format stays one failure, not an INTERNALERROR
that ends the run.  Shown with a real pytest run in a child process whose source formatting raises the
SystemError CPython 3.11 raises when two threads parse at once (gh-106905)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from procs import child_env

FAILING = '''
import _pytest._code.code as code


def broken_parse(*args, **kwargs):
    raise SystemError("AST constructor recursion depth mismatch (before=147, after=163)")


def test_fails():
    code.getstatementrange_ast = broken_parse  # what the race does to pytest's reading of this file
    assert 1 == 2, "the real failure"


def test_passes():
    assert True
'''


def _run(tmp_path: Path, *plugin: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_failing.py").write_text(FAILING)
    env = child_env()
    env["PYTHONPATH"] = f"{Path(__file__).parent}:{env.get('PYTHONPATH', '')}"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path),
                           "-c", "/dev/null", *plugin, str(tmp_path / "test_failing.py")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def test_an_unformattable_failure_is_reported_as_a_failure(tmp_path: Path) -> None:
    guarded = _run(tmp_path, "-p", "report_guard")
    assert guarded.returncode == 1, guarded.stdout + guarded.stderr
    assert "INTERNALERROR" not in guarded.stdout + guarded.stderr
    assert "1 failed, 1 passed" in guarded.stdout, guarded.stdout
    assert "the real failure" in guarded.stdout and "pytest could not format this failure" in guarded.stdout


def test_without_the_guard_the_same_failure_is_an_internal_error(tmp_path: Path) -> None:
    bare = _run(tmp_path)
    assert bare.returncode == 3, bare.stdout + bare.stderr  # pytest's exit code for an internal error
    assert "INTERNALERROR" in bare.stdout + bare.stderr and "recursion depth mismatch" in bare.stdout + bare.stderr
