"""The JVM jars sparkmq uses, fetched once from Maven Central into a cache (standard library only).

The sets are declared in ``conf/jars.toml`` (Delta for the lake, and the Java clients and servers the tests and
benchmarks run).  :func:`fetch` resolves a set with Maven (``dependency:copy-dependencies``: Maven honours
mirrors and keeps its own repository as a second cache) into ``<cache>/<set>-<digest>/``; a folder that is
complete is reused as it is, so a second fetch downloads nothing.  :func:`jars` lists a fetched set for a
classpath or ``spark.jars`` and raises :class:`MissingJarsError` -- one message that says what is missing and
how to provide it -- when the set is not there.

``build.py`` loads this file by path (it runs before the virtual environment exists), so it imports nothing
from sparkmq.

    >>> from sparkmq.platform.common import jars
    >>> jars.classpath("delta")                   # doctest: +SKIP
    '/root/.cache/sparkmq/jars/delta-3f1c2a9b07de/delta-spark_4.2_2.13-4.4.0.jar:...'
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

__all__ = [
    "CONF_FILE",
    "JarSet",
    "MissingJarsError",
    "cache_root",
    "classpath",
    "fetch",
    "jar_sets",
    "jars",
    "set_dir",
]

#: Where the sets are declared (the repository's conf/; an installed copy reads $SPARKMQ_JARS_CONF).
CONF_FILE = Path(os.environ.get("SPARKMQ_JARS_CONF", Path(__file__).resolve().parents[2] / "conf" / "jars.toml"))
#: The marker of a complete set folder: written last, after every jar was copied.
_COMPLETE = ".complete"
_COORD = re.compile(r"^[\w.\-]+:[\w.\-]+:[\w.\-]+$")


class MissingJarsError(RuntimeError):
    """A set of jars is not in the cache and could not be fetched; the message says how to provide it."""


@dataclass(frozen=True)
class JarSet:
    """One set of ``conf/jars.toml``: Maven coordinates resolved with their runtime dependencies."""

    name: str
    artifacts: tuple[str, ...]
    exclude_groups: tuple[str, ...] = ()
    skip_spark_jars: bool = False
    setup: bool = False
    purpose: str = ""

    def __post_init__(self) -> None:
        bad = [a for a in self.artifacts if not _COORD.match(a)]
        if not self.artifacts or bad:
            raise ValueError(f"jar set {self.name!r}: artifacts must be 'group:artifact:version', got {bad or '[]'}")

    @property
    def digest(self) -> str:
        """A digest of the definition: a changed version or exclusion means another folder."""
        text = json.dumps([self.artifacts, self.exclude_groups, self.skip_spark_jars], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def env_override(self) -> str:
        """The environment variable that names a folder holding this set's jars (offline machines)."""
        return "SPARKMQ_JARS_" + re.sub(r"[^A-Za-z0-9]", "_", self.name).upper()


def jar_sets(conf_file: Path | None = None) -> dict[str, JarSet]:
    """Every set declared in ``conf/jars.toml``, by name."""
    with open(conf_file or CONF_FILE, "rb") as fh:
        raw = tomllib.load(fh)
    return {name: JarSet(name=name, artifacts=tuple(spec["artifacts"]),
                         exclude_groups=tuple(spec.get("exclude_groups", ())),
                         skip_spark_jars=bool(spec.get("skip_spark_jars", False)),
                         setup=bool(spec.get("setup", False)), purpose=str(spec.get("purpose", "")))
            for name, spec in raw.items()}


def _get(name: str) -> JarSet:
    sets = jar_sets()
    if name not in sets:
        raise KeyError(f"no jar set {name!r} in {CONF_FILE}; sets: {', '.join(sorted(sets))}")
    return sets[name]


def cache_root() -> Path:
    """The jar cache: ``$SPARKMQ_JARS_DIR``, else ``$XDG_CACHE_HOME/sparkmq/jars`` (``~/.cache/sparkmq/jars``)."""
    if os.environ.get("SPARKMQ_JARS_DIR"):
        return Path(os.environ["SPARKMQ_JARS_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "sparkmq" / "jars"


def set_dir(name: str) -> Path:
    """The folder of a set: the override named by its environment variable, else its folder in the cache."""
    spec = _get(name)
    override = os.environ.get(spec.env_override)
    return Path(override) if override else cache_root() / f"{name}-{spec.digest}"


def _how_to_provide(spec: JarSet) -> str:
    return (f"the jar set {spec.name!r} ({spec.purpose or ', '.join(spec.artifacts)}) is missing. "
            f"Run `python3 build.py setup` on a machine that reaches Maven Central (it fetches "
            f"{', '.join(spec.artifacts)} with their dependencies into {cache_root()}), or put those jars in a "
            f"folder and set {spec.env_override}=<folder>, or set SPARKMQ_MAVEN_REPO to a Maven mirror URL or a "
            f"local Maven repository path that holds them and run setup again")


def jars(name: str) -> list[Path]:
    """The jar files of a fetched set, sorted; :class:`MissingJarsError` when the set is not there."""
    spec = _get(name)
    folder = set_dir(name)
    overridden = bool(os.environ.get(spec.env_override))
    found = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not found or (not overridden and not (folder / _COMPLETE).exists()):
        raise MissingJarsError(_how_to_provide(spec))
    return found


def classpath(name: str | Sequence[str]) -> str:
    """A Java classpath (``:``-joined) of one set or of several."""
    names = [name] if isinstance(name, str) else list(name)
    return os.pathsep.join(str(p) for n in names for p in jars(n))


def _pom(spec: JarSet) -> str:
    deps = []
    for coord in spec.artifacts:
        group, artifact, version = coord.split(":")
        deps.append(f"<dependency><groupId>{escape(group)}</groupId><artifactId>{escape(artifact)}</artifactId>"
                    f"<version>{escape(version)}</version></dependency>")
    repo = os.environ.get("SPARKMQ_MAVEN_REPO", "")
    repos = ""
    if repo.startswith(("http://", "https://")):
        repos = (f"<repositories><repository><id>sparkmq-mirror</id><url>{escape(repo)}</url></repository>"
                 f"</repositories><pluginRepositories><pluginRepository><id>sparkmq-mirror</id>"
                 f"<url>{escape(repo)}</url></pluginRepository></pluginRepositories>")
    return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<project xmlns=\"http://maven.apache.org/POM/4.0.0\"><modelVersion>4.0.0</modelVersion>"
            f"<groupId>sparkmq.jars</groupId><artifactId>{escape(spec.name)}</artifactId><version>1</version>"
            f"<packaging>pom</packaging>{repos}<dependencies>{''.join(deps)}</dependencies></project>\n")


def _artifact_name(jar: str) -> str:
    """``parquet-hadoop-1.16.0.jar`` -> ``parquet-hadoop``: the name without its version."""
    return re.sub(r"-\d[\w.]*(?:-[\w.]+)*\.jar$", "", jar)


def _spark_artifacts() -> set[str]:
    try:
        import pyspark
    except ImportError:
        return set()
    folder = Path(pyspark.__file__).parent / "jars"
    return {_artifact_name(p.name) for p in folder.glob("*.jar")}


def fetch(name: str, *, say: Callable[[str], None] = print, spark_jars: set[str] | None = None) -> Path:
    """Fetch a set into the cache unless it is there; return its folder.

    ``spark_jars``: artifact names the installed pyspark ships (computed from pyspark when None), left out of
    sets marked ``skip_spark_jars``.  Raises :class:`MissingJarsError` when Maven is missing or fails.
    """
    spec = _get(name)
    folder = set_dir(name)
    if os.environ.get(spec.env_override):
        jars(name)  # an override must hold jars; it is never written to
        say(f"jars {name}: {folder} (from {spec.env_override})")
        return folder
    if (folder / _COMPLETE).exists():
        say(f"jars {name} present ({folder})")
        return folder
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingJarsError("Maven (`mvn`) is not installed, so " + _how_to_provide(spec)
                               + " (Debian/Ubuntu: `sudo apt-get install -y maven`)")
    staging = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "lib").mkdir(parents=True)
    (staging / "pom.xml").write_text(_pom(spec), encoding="utf-8")
    cmd = [mvn, "-B", "-q", "-f", str(staging / "pom.xml"), "dependency:copy-dependencies",
           f"-DoutputDirectory={staging / 'lib'}", "-DincludeScope=runtime"]
    if spec.exclude_groups:
        cmd.append("-DexcludeGroupIds=" + ",".join(spec.exclude_groups))
    repo = os.environ.get("SPARKMQ_MAVEN_REPO", "")
    if repo and not repo.startswith(("http://", "https://")):
        cmd.append(f"-Dmaven.repo.local={repo}")
    say(f"fetching jars {name}: {', '.join(spec.artifacts)} and their dependencies (Maven Central, once)")
    result = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join(line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line)[-2000:]
        raise MissingJarsError(f"Maven could not fetch them ({tail.strip() or f'exit code {result.returncode}'}); "
                               + _how_to_provide(spec))
    skip = (_spark_artifacts() if spark_jars is None else spark_jars) if spec.skip_spark_jars else set()
    kept = []
    for jar in sorted((staging / "lib").glob("*.jar")):
        if _artifact_name(jar.name) in skip:
            continue
        jar.rename(staging / jar.name)
        kept.append(jar.name)
    shutil.rmtree(staging / "lib")
    (staging / _COMPLETE).write_text("\n".join(kept) + "\n", encoding="utf-8")
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(folder)
    say(f"jars {name}: {len(kept)} jars in {folder}")
    return folder
