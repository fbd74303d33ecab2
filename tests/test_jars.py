"""The Delta jars: ``build.py setup`` fetches them once with Maven into the jar cache, a second run fetches
nothing, and a machine without them gets one clear message, never a stack trace from inside Spark.

Maven runs for real (``mvn`` on PATH, resolving from its local repository or Maven Central) behind a
recording shim, so "fetches nothing" is checked by what ran, not by timing: the shim's log, and the
cache folder's ``.complete`` marker left untouched.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from procs import child_env
from sparkmq.platform.common import jars

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]   # real processes: build.py, Maven

ROOT = Path(__file__).resolve().parents[1]


def _mvn_shim(tmp_path: Path) -> tuple[Path, Path]:
    """A directory with an ``mvn`` that logs each call and runs the real Maven; (bin dir, log file)."""
    real = shutil.which("mvn")
    assert real, "Maven (mvn) must be installed to fetch the jar sets (Debian: apt-get install -y maven)"
    bin_dir, log = tmp_path / "bin", tmp_path / "mvn-calls.log"
    bin_dir.mkdir()
    shim = bin_dir / "mvn"
    shim.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexec "{real}" "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return bin_dir, log


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_setup_fetches_the_delta_jars_once(tmp_path: Path) -> None:
    bin_dir, log = _mvn_shim(tmp_path)
    cache = tmp_path / "jar-cache"
    env = child_env(SPARKMQ_JARS_DIR=str(cache), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env.pop("SPARKMQ_JARS_DELTA", None)

    first = subprocess.run([sys.executable, str(ROOT / "build.py"), "setup"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert "fetching jars delta" in first.stdout
    # One Maven run per set that setup fetches (delta, and the Java clients' set the tests use).
    calls = _calls(log)
    assert len([c for c in calls if "/delta-" in c]) == 1 and all("dependency:copy-dependencies" in c for c in calls)
    [folder] = [p for p in cache.iterdir() if p.name.startswith("delta-")]
    complete = folder / ".complete"
    names = sorted(p.name for p in folder.glob("*.jar"))
    assert any(n.startswith("delta-spark_4.2_2.13-") for n in names)
    assert any(n.startswith("delta-storage-") for n in names)
    # Jars pyspark already ships (Hadoop, Parquet, Jackson core) are left out: one of each on the classpath.
    assert not any(n.startswith(("hadoop-client-runtime", "parquet-hadoop", "jackson-databind")) for n in names)
    marker = complete.stat().st_mtime_ns

    second = subprocess.run([sys.executable, str(ROOT / "build.py"), "setup"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "jars delta present" in second.stdout and "fetching jars" not in second.stdout
    assert _calls(log) == calls                        # Maven did not run again
    assert complete.stat().st_mtime_ns == marker and sorted(p.name for p in folder.glob("*.jar")) == names


_START_SPARK = """
from sparkmq.pipelines.session import get_spark
get_spark({"spark.master": "local[1]"})
"""


def test_without_the_jars_one_clear_message(tmp_path: Path) -> None:
    """No jar cache and no Maven: setup and a SparkSession both say what is missing and how to provide it."""
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    path = os.pathsep.join([str(empty_bin)] + [d for d in os.environ["PATH"].split(os.pathsep)
                                               if not (Path(d) / "mvn").exists()])
    # Maven's folder may hold java too (Debian's /usr/bin): JAVA_HOME keeps Java while mvn is gone.
    java_home = Path(shutil.which("java") or "java").resolve().parent.parent
    env = child_env(SPARKMQ_JARS_DIR=str(tmp_path / "no-jars"), PATH=path,
                    JAVA_HOME=os.environ.get("JAVA_HOME") or str(java_home))
    env.pop("SPARKMQ_JARS_DELTA", None)

    spark = subprocess.run([sys.executable, "-c", _START_SPARK], env=env, capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
    assert spark.returncode != 0
    last = spark.stderr.strip().splitlines()[-1]
    assert last.startswith("sparkmq.platform.common.jars.MissingJarsError: the jar set 'delta'"), spark.stderr[-2000:]
    for hint in ("python3 build.py setup", "SPARKMQ_JARS_DELTA=<folder>", "SPARKMQ_MAVEN_REPO"):
        assert hint in last
    assert "py4j" not in spark.stderr and "java." not in spark.stderr      # no JVM was even started

    fetch = subprocess.run([sys.executable, str(ROOT / "build.py"), "jars", "delta"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert fetch.returncode == 2
    errors = [line for line in fetch.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "Maven (`mvn`) is not installed" in errors[0] and "SPARKMQ_JARS_DELTA" in errors[0]


def test_a_folder_named_by_the_environment_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline machines: SPARKMQ_JARS_DELTA names a folder of jars (copied from elsewhere); nothing is fetched."""
    folder = tmp_path / "delta-jars"
    folder.mkdir()
    for jar in jars.jars("delta"):
        shutil.copy(jar, folder / jar.name)
    monkeypatch.setenv("SPARKMQ_JARS_DELTA", str(folder))
    monkeypatch.setenv("PATH", str(tmp_path))          # no mvn: it must not be needed
    assert jars.jars("delta") == sorted(folder.glob("*.jar"))
    assert jars.fetch("delta", say=lambda _: None) == folder
    (folder / "x.jar").unlink(missing_ok=True)
    for jar in folder.glob("*.jar"):
        jar.unlink()
    with pytest.raises(jars.MissingJarsError, match="SPARKMQ_JARS_DELTA"):
        jars.jars("delta")
