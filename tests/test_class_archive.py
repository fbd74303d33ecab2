"""Spark's class-data archive: used only when complete, mapped by the session's JVM, options merged."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparkmq.pipelines import class_archive
from sparkmq.pipelines.session import _driver_java_options


@pytest.fixture
def archive_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(class_archive, "_directory", lambda: tmp_path)
    return tmp_path


def test_an_archive_is_used_only_with_a_manifest_of_its_exact_size(archive_dir: Path) -> None:
    archive = class_archive.archive_path()
    assert archive is not None and archive.parent == archive_dir and archive.name.startswith("spark-classes-")
    assert class_archive.java_options() == ""                       # none built
    archive.write_bytes(b"\0" * 4096)
    assert class_archive.java_options() == ""                       # no manifest: maybe still being written
    archive.with_suffix(".json").write_text(json.dumps({"size": 8192}))
    assert class_archive.java_options() == ""                       # truncated: a JVM would crash on it
    archive.with_suffix(".json").write_text(json.dumps({"size": 4096}))
    assert class_archive.java_options() == f"-XX:SharedArchiveFile={archive}"
    archive.with_suffix(".json").write_text("{not json")
    assert class_archive.java_options() == ""


def test_the_name_follows_the_java_binary(archive_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = class_archive.archive_path()
    other_java = tmp_path / "jdk" / "bin" / "java"
    other_java.parent.mkdir(parents=True)
    other_java.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert class_archive.archive_path() not in (None, here)


def test_driver_options_keep_the_users_own(archive_dir: Path) -> None:
    options = _driver_java_options("WARN", True, "-Dmy.setting=1")
    assert options.startswith("-Dlog4j2.configurationFile=file:") and options.endswith(" -Dmy.setting=1")
    assert "SharedArchiveFile" not in options                        # this environment (tmp) has no archive
    assert "SharedArchiveFile" not in _driver_java_options("WARN", False, "")


@pytest.mark.spark
def test_the_sessions_jvm_maps_the_environments_archive(spark) -> None:
    """Where build.py set the environment up (CI does), every Spark driver maps the archive it built."""
    archive = class_archive.archive_path()
    if not class_archive.java_options():
        if os.environ.get("CI"):
            pytest.fail(f"build.py setup built no usable class-data archive at {archive}")
        pytest.skip("this environment has no class-data archive (python3 build.py setup builds it)")
    jvm = spark.sparkContext._gateway.proc.pid
    assert str(archive) in Path(f"/proc/{jvm}/maps").read_text()


def test_the_name_follows_the_delta_jars_not_their_folder(archive_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The Delta classes are archived too: other Delta jars mean another archive; the same jars elsewhere
    (a copied folder named by SPARKMQ_JARS_DELTA) are the same classes, the same archive."""
    import shutil

    from sparkmq.platform.common import jars

    here = class_archive.archive_path()
    copy = tmp_path / "delta-copy"
    copy.mkdir()
    for jar in jars.jars("delta"):
        shutil.copy(jar, copy / jar.name)
    monkeypatch.setenv("SPARKMQ_JARS_DELTA", str(copy))
    assert class_archive.archive_path() == here
    (copy / "extra-1.0.jar").write_bytes(b"PK")
    assert class_archive.archive_path() not in (None, here)
