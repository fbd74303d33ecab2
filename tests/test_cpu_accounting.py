"""The suite's CPU accounting (tests/cpu_accounting.py) counts what a test's own processes use, and cleans up."""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import cpu_accounting

from conftest import need

TESTS = Path(__file__).resolve().parent

BUSY_CHILD = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0:\n    pass\n"


def test_a_tests_cpu_includes_the_child_processes_it_starts(tmp_path: Path) -> None:
    need("a writable cgroup v1 cpuacct hierarchy", os.access(cpu_accounting.CPUACCT, os.W_OK),
         f"{cpu_accounting.CPUACCT} is where each test's CPU is measured")
    (tmp_path / "test_work.py").write_text(
        "import subprocess, sys\n\n"
        f"def test_busy_child():\n    subprocess.run([sys.executable, '-c', {BUSY_CHILD!r}], check=True)\n\n"
        "def test_idle():\n    pass\n")
    stale = cpu_accounting.CPUACCT / "sparkmq-tests-0"   # an empty cgroup an earlier run left behind
    stale.mkdir(exist_ok=True)
    report = tmp_path / "report.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop("SPARKMQ_TEST_CPU_ACCOUNTING", None)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "cpu_accounting", "-p", "no:cacheprovider",
                             f"--junitxml={report}", f"--rootdir={tmp_path}", str(tmp_path / "test_work.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    cpu = {case.get("name"): float(prop.get("value")) for case in ET.parse(report).iter("testcase")
           for prop in case.iter("property") if prop.get("name") == "cpu_s"}
    assert cpu["test_busy_child"] >= 0.9 and cpu["test_idle"] < 0.5, cpu
    assert "CPU per test" in out and "test_busy_child" in out, out
    assert not (cpu_accounting.CPUACCT / f"sparkmq-tests-{proc.pid}").exists()  # its cgroup went with it
    assert not stale.exists()
