#!/usr/bin/env python3
"""The one entry point of sparkmq: set up, build, run, test, benchmark.

    python3 build.py run            # set up, then start the platform with a demo
    python3 build.py test           # set up, then run the whole test suite (pytest arguments may follow)
    python3 build.py setup          # venv in .venv, dependencies, the C extension
    python3 build.py bench [GROUP] [--quick] [ARGS...]   # ARGS go to that group's script (bench soak --minutes 3)
    python3 build.py jars [SET...]  # fetch JVM jar sets of conf/jars.toml (setup fetches those it needs)
    python3 build.py clean          # remove build products (keeps .venv)

Every step is idempotent: a second run skips what is already done.  Only the
standard library is used here, because this script creates the environment
everything else runs in.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import hashlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
VENV_PY = VENV / "bin" / "python"
#: pytest-xdist workers for `build.py test` (the tests mostly wait on processes, so 2 suit a 2-core machine).
TEST_WORKERS = int(os.environ.get("SPARKMQ_TEST_WORKERS", "2"))
#: The machine's Python speed of the day (``../shared/tools/python_echo.py``, or ``$SPARKMQ_PYTHON_ECHO``) and the
#: reading the issues' targets and the tests' waits were set at.
PYTHON_ECHO = Path(os.environ.get("SPARKMQ_PYTHON_ECHO") or ROOT.parent / "shared" / "tools" / "python_echo.py")
REFERENCE_PYTHON_ECHO = 140_000
#: How far the tests' waits stretch on a slow day, at most (see :func:`machine_slowness`).
MAX_TEST_SLOWNESS = 4.0
STAMP = VENV / ".sparkmq-setup"
NATIVE_SOURCES = sorted((ROOT / "storage_native").glob("*.[ch]"))
MIN_PYTHON = (3, 11)
MIN_JAVA = 17


def say(message: str) -> None:
    """A progress line a person can follow."""
    print(f"[sparkmq] {message}", flush=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print an error a person can act on and exit."""
    print(f"[sparkmq] ERROR: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def run(cmd: list[str], **kwargs) -> None:
    """Run a command, echoing it; stop with its exit code when it fails."""
    say("$ " + " ".join(str(c) for c in cmd))
    result = subprocess.run(cmd, **kwargs)
    if result.returncode != 0:
        fail(f"command failed with exit code {result.returncode}: {' '.join(str(c) for c in cmd)}",
             result.returncode)


# -- checks -------------------------------------------------------------------
def check_python() -> None:
    if sys.version_info < MIN_PYTHON:
        fail(f"Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+ is required, this is {sys.version.split()[0]}; "
             "run build.py with a newer python3")


def java_version() -> int | None:
    """Major version of the java on PATH (or in JAVA_HOME), None when there is none."""
    java = shutil.which("java")
    if os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        if candidate.exists():
            java = str(candidate)
    if not java:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8" means 8


def check_java() -> None:
    version = java_version()
    if version is None:
        fail("Java was not found. Spark needs Java 17 or newer: install it "
             "(Debian/Ubuntu: `sudo apt-get install -y openjdk-17-jre-headless`; macOS: `brew install openjdk@17`) "
             "or set JAVA_HOME to a JDK 17+, then run this command again.")
    if version < MIN_JAVA:
        fail(f"Java {version} was found, Spark needs Java {MIN_JAVA} or newer: install a JDK 17+ "
             "(Debian/Ubuntu: `sudo apt-get install -y openjdk-17-jre-headless`) or point JAVA_HOME at one.")
    say(f"java {version} found")


# -- setup --------------------------------------------------------------------
def _setup_fingerprint() -> str:
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "setup.py"):
        digest.update((ROOT / name).read_bytes())
    digest.update(sys.version.encode())
    return digest.hexdigest()


def _native_built() -> Path | None:
    built = sorted((ROOT / "storage_native").glob("_commitlog*.so"))
    return built[0] if built else None


def build_native(force: bool = False) -> None:
    """Compile the C extension in place when a source is newer than the built module."""
    built = _native_built()
    newest = max(p.stat().st_mtime for p in NATIVE_SOURCES) if NATIVE_SOURCES else 0
    if built and not force and built.stat().st_mtime >= newest:
        say(f"native extension up to date ({built.name})")
        return
    say("building the native commit log (C extension)")
    run([str(VENV_PY), "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT)


def setup(force: bool = False) -> None:
    """Create .venv, install sparkmq with its dependencies, build the extension."""
    check_python()
    check_java()
    if not VENV_PY.exists():
        say(f"creating the virtual environment in {VENV}")
        run([sys.executable, "-m", "venv", str(VENV)])
    fingerprint = _setup_fingerprint()
    if force or not STAMP.exists() or STAMP.read_text() != fingerprint:
        say("installing dependencies (first run: about a minute, pyspark is large)")
        pip = [str(VENV_PY), "-m", "pip", "--disable-pip-version-check"]
        run(pip + ["install", "-q", "--upgrade", "pip", "setuptools>=69", "wheel"])
        run(pip + ["install", "-q", "--no-build-isolation", "-e", ".[test]"], cwd=ROOT)
        STAMP.write_text(fingerprint)
    else:
        say("dependencies up to date")
    build_native(force=force)
    fetch_jar_sets()
    build_class_archive(force=force)
    vendor_web_assets(force=force)
    ensure_chromium()
    say("setup complete")


# -- web assets and the test browser ---------------------------------------------------------
#: Where the console and the services' /docs pages find the bundled JavaScript (package data, git-ignored).
VENDOR_DIR = ROOT / "api" / "console" / "static" / "vendor"
NPM_REGISTRY = "https://registry.npmjs.org"


@dataclasses.dataclass(frozen=True)
class NpmAsset:
    """One npm package pinned by version and by the registry's sha512 integrity, and the files taken from it."""

    name: str
    version: str
    integrity: str  # "sha512-<base64>", as the registry's dist.integrity; checked before anything is unpacked
    files: tuple[str, ...]  # paths inside the tarball's package/ directory

    @property
    def target(self) -> Path:
        return VENDOR_DIR / self.name


#: The console's chart library and Swagger UI; bump a version together with its integrity.
NPM_ASSETS = (
    NpmAsset("uplot", "1.6.32",
             "sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==",
             ("dist/uPlot.iife.min.js", "dist/uPlot.min.css", "LICENSE")),
    NpmAsset("swagger-ui-dist", "5.35.0",
             "sha512-U06rpMtW9V3XPGOBeamTUSr0Z09jMX4IJuANpE/EZbAhw0G8CgwrzU4YmXkn/h0wCDNsXdGarTNNHC3sU8yVUQ==",
             ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png", "LICENSE")),
)


def _vendored(asset: NpmAsset) -> bool:
    stamp = asset.target / ".version"
    return stamp.exists() and stamp.read_text().strip() == asset.version and all(
        (asset.target / Path(f).name).exists() for f in asset.files)


def vendor_web_assets(force: bool = False) -> None:
    """Download the pinned npm packages (registry tarballs, stdlib only: npm need not be installed), check their
    sha512 against the pinned integrity, and copy the files the console and /docs serve into VENDOR_DIR."""
    for asset in NPM_ASSETS:
        if _vendored(asset) and not force:
            say(f"web asset {asset.name} {asset.version} present")
            continue
        url = f"{NPM_REGISTRY}/{asset.name}/-/{asset.name.rsplit('/', 1)[-1]}-{asset.version}.tgz"
        say(f"downloading {asset.name} {asset.version} from the npm registry")
        try:
            with urllib.request.urlopen(url, timeout=120) as response:
                data = response.read()
        except OSError as exc:
            fail(f"could not download {url}: {exc}; the console and /docs need it (network to registry.npmjs.org)")
        algo, _, expected = asset.integrity.partition("-")
        actual = base64.b64encode(hashlib.new(algo, data).digest()).decode()
        if actual != expected:
            fail(f"{asset.name} {asset.version}: {algo} of the download is {actual}, pinned {expected}; not unpacked")
        staging = asset.target.with_name(asset.target.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for name in asset.files:
                member = archive.extractfile(f"package/{name}")
                if member is None:
                    fail(f"{asset.name} {asset.version} has no file {name}")
                (staging / Path(name).name).write_bytes(member.read())
        (staging / ".version").write_text(asset.version + "\n")
        shutil.rmtree(asset.target, ignore_errors=True)
        staging.rename(asset.target)
    say(f"web assets in {VENDOR_DIR.relative_to(ROOT)}")


def ensure_chromium() -> None:
    """Install Debian's chromium for the console's browser tests when it is missing and apt can be used
    (as root, or through passwordless sudo); otherwise say so: those tests then skip with the reason."""
    if shutil.which("chromium"):
        say("chromium found (browser tests)")
        return
    if not shutil.which("apt-get"):
        say("chromium not found and no apt-get: the console's browser tests will skip")
        return
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], stdin=subprocess.DEVNULL,
                                                 capture_output=True).returncode == 0:
        prefix = ["sudo", "-n"]
    else:
        say("chromium not found and apt needs root: `sudo apt-get install -y chromium` for the browser tests")
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "CI": "true"}
    say("installing chromium with apt-get (browser tests; a few minutes once)")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium", "fonts-liberation"]
    for cmd in (["apt-get", "update", "-q"], install):
        result = subprocess.run(prefix + cmd, env=env, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            say(f"`{' '.join(cmd)}` failed ({result.returncode}): the console's browser tests will skip")
            return


def _jars_module():
    """``platform/common/jars.py``, loaded by path: it is standard library only, and the venv may not exist yet."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_sparkmq_jars", ROOT / "platform" / "common" / "jars.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _spark_jar_names() -> set[str]:
    """Artifact names of the jars the venv's pyspark ships (a Delta set leaves those out)."""
    out = subprocess.run([str(VENV_PY), "-c", "import pyspark, os; print(os.path.dirname(pyspark.__file__))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    module = _jars_module()
    return {module._artifact_name(p.name) for p in (Path(out) / "jars").glob("*.jar")}


def fetch_jar_sets(names: list[str] | None = None) -> None:
    """Fetch the jar sets of conf/jars.toml (those marked ``setup``, or ``names``) once into the jar cache."""
    module = _jars_module()
    sets = module.jar_sets()
    wanted = names if names is not None else [n for n, s in sets.items() if s.setup]
    unknown = [n for n in wanted if n not in sets]
    if unknown:
        fail(f"no jar set {', '.join(unknown)} in conf/jars.toml; sets: {', '.join(sorted(sets))}")
    spark_jars = _spark_jar_names() if any(sets[n].skip_spark_jars for n in wanted) else set()
    for name in wanted:
        try:
            module.fetch(name, say=say, spark_jars=spark_jars)
        except module.MissingJarsError as exc:
            fail(str(exc))


def build_class_archive(force: bool = False) -> None:
    """Spark's classes, parsed once into an archive every Spark driver here maps: it starts in about 5 s, not 9 s.

    Built once per environment (about a minute); a failure only means Spark starts without it.
    """
    cmd = [str(VENV_PY), "-m", "sparkmq.pipelines.class_archive", "build"] + (["--force"] if force else [])
    subprocess.run(cmd, cwd=ROOT, env=venv_env(), stdin=subprocess.DEVNULL)


def venv_env() -> dict[str, str]:
    """Environment for processes run in the venv (Spark workers must use the venv's python)."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = str(VENV_PY)
    env["PYSPARK_DRIVER_PYTHON"] = str(VENV_PY)
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# -- commands -----------------------------------------------------------------
def cmd_setup(args: argparse.Namespace) -> None:
    setup(force=args.force)


def cmd_run(args: argparse.Namespace) -> None:
    setup()
    say("starting the embedded platform (Ctrl-C stops it)")
    cmd = [str(VENV_PY), "-m", "sparkmq.api.cli", "dev"] + args.extra
    os.execve(str(VENV_PY), cmd, venv_env())


def cmd_test(args: argparse.Namespace) -> None:
    setup()
    say("running the test suite")
    started = time.monotonic()
    # The slowest tests are listed at the end: the suite must stay well under 30 minutes.
    base = [str(VENV_PY), "-m", "pytest", "--durations=25"]
    if args.extra:  # the caller chose what to run, and how
        phases = [base + args.extra]
    else:
        # Most tests wait on processes, sockets and JVMs: two workers (one test file each at a time) share the
        # cores well.  Files are handed out in collection order, which starts with the slowest (SLOW_FILES in
        # tests/conftest.py); xdist's default would reorder them by their number of tests.  Tests that compare
        # their own timings run afterwards, alone.
        parallel = ["-n", str(TEST_WORKERS), "--dist", "loadfile", "--no-loadscope-reorder", "-m", "not serial"]
        # Every test's time, for ordering SLOW_FILES from measurements (var/ is not tracked).
        reports = [f"--junitxml={ROOT / 'var' / 'test-reports' / name}.xml" for name in ("parallel", "serial")]
        phases = [base + parallel + [reports[0]], base + ["-m", "serial", reports[1]]]
    env = venv_env()
    if "SPARKMQ_TEST_SLOWNESS" not in env:  # set by hand: kept
        env["SPARKMQ_TEST_SLOWNESS"] = f"{machine_slowness():.2f}"
    say(f"waits and test time limits stretched x{env['SPARKMQ_TEST_SLOWNESS']} for the machine's speed today")
    adopt_orphans()
    returncode = 0
    for number, cmd in enumerate(phases):
        if number:  # the serial tests compare timings: not beside what the phase before left behind
            settle_machine()
        result = subprocess.run(cmd, cwd=ROOT, env=env)
        returncode = returncode or result.returncode
        for leftover in stop_leftovers():
            say(f"a process the tests left running was stopped: {leftover}")
    say(f"tests finished in {time.monotonic() - started:.0f} s with exit code {returncode}")
    sys.exit(returncode)


def machine_slowness() -> float:
    """How much slower than the reference this machine runs Python today: ``REFERENCE_PYTHON_ECHO`` over what
    ``python_echo`` reads now, between 1 and :data:`MAX_TEST_SLOWNESS` (1 when it cannot run).

    The machine is shared and its speed drifts up to 2x between days; a wait that is ample on a normal day times
    out on a slow one.  The tests' polling helper and their time limits multiply by this (tests/procs.py)."""
    if not PYTHON_ECHO.exists():
        say(f"{PYTHON_ECHO} not found: the tests' waits keep their normal-day bounds")
        return 1.0
    done = subprocess.run([sys.executable, str(PYTHON_ECHO)], capture_output=True, text=True, timeout=300)
    found = re.search(r"^machine\.python_echo msgs_per_s=([\d.]+)", done.stdout, re.M)
    if not found:
        say(f"python_echo printed no figure ({done.stderr[-200:]!r}): the tests' waits keep their bounds")
        return 1.0
    print(found.group(0), flush=True)
    return min(MAX_TEST_SLOWNESS, max(1.0, REFERENCE_PYTHON_ECHO / float(found.group(1))))


# -- what a test run leaves behind ---------------------------------------------
PR_SET_CHILD_SUBREAPER = 36
#: Before the serial phase: how idle the machine must be (share of CPU time over one sample), and how long to wait.
QUIET_IDLE_SHARE = 0.8
QUIET_WAIT_S = 90.0
#: How long a process the tests left may take to exit by itself before it is killed.
LEFTOVER_GRACE_S = 30.0


def adopt_orphans() -> None:
    """Make this process the subreaper of everything the tests start (Linux): a process whose parent exits
    without stopping it is re-parented here rather than to init, so :func:`stop_leftovers` finds it."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _children() -> dict[int, str]:
    """This process's children (pid -> command line), from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = os.readlink(entry / "cwd") if words[0] else ""
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid():
            # A JVM's class path is long: name its main class (and what follows) instead.
            main = next((i for i, word in enumerate(words) if word.startswith(("org.", "com."))), 0)
            command = " ".join(words[:1] + words[max(1, main):]).strip()
            age_s = _uptime_s() - int(fields[19]) / os.sysconf("SC_CLK_TCK")
            found[int(entry.name)] = f"{command[:300]} (in {cwd}, for {age_s:.0f} s)" if command else ""
    return found


def _uptime_s() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def _reap_exited() -> None:
    """Reap the adopted children that have exited (zombies)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def stop_leftovers(grace_s: float = LEFTOVER_GRACE_S) -> list[str]:
    """What the finished test phase left running (adopted orphans; their own orphans in turn): given ``grace_s``
    to exit by itself (a pytest worker's Spark JVM shuts down after its worker), then SIGKILLed and reaped; the pid
    and command line of each one killed."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap_exited()
        if not _children():
            return []
        time.sleep(0.5)
    stopped = []
    for _ in range(50):
        children = _children()
        if not children:
            break
        for pid, command in children.items():
            if command:  # a zombie has no command line: it only needs reaping
                stopped.append(f"{pid} {command}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return stopped


def _cpu_times() -> tuple[int, int]:
    """(idle + iowait, total) jiffies of all CPUs since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def settle_machine() -> None:
    """Write dirty pages back and wait (up to :data:`QUIET_WAIT_S`) until the CPUs are mostly idle over one
    second: the phase before may leave the kernel writing gigabytes back, or JVMs exiting."""
    os.sync()
    if not Path("/proc/stat").exists():
        return
    started = time.monotonic()
    while True:
        idle_before, total_before = _cpu_times()
        time.sleep(1.0)
        idle_after, total_after = _cpu_times()
        idle = (idle_after - idle_before) / max(1, total_after - total_before)
        waited = time.monotonic() - started
        if idle >= QUIET_IDLE_SHARE or waited >= QUIET_WAIT_S:
            say(f"serial phase: the CPUs {idle:.0%} idle after {waited:.0f} s")
            return


def cmd_bench(args: argparse.Namespace) -> None:
    setup()
    scripts = sorted((ROOT / "benchmarks").glob("bench_*.py"))
    if args.group:
        scripts = [s for s in scripts if s.stem == f"bench_{args.group}"]
        if not scripts:
            fail(f"no benchmark group {args.group!r}; groups: "
                 + ", ".join(s.stem[6:] for s in sorted((ROOT / 'benchmarks').glob('bench_*.py'))))
    if args.extra and not args.group:
        fail(f"arguments {' '.join(args.extra)!r} belong to one benchmark group: name it (bench soak --minutes 3)")
    for script in scripts:
        say(f"benchmark {script.stem[6:]}{' (quick)' if args.quick else ''}")
        extra = (["--quick"] if args.quick else []) + args.extra
        run([str(VENV_PY), str(script)] + extra, cwd=ROOT, env=venv_env())


def cmd_jars(args: argparse.Namespace) -> None:
    setup()
    fetch_jar_sets(args.sets or list(_jars_module().jar_sets()))


def cmd_clean(args: argparse.Namespace) -> None:
    for path in [ROOT / "build", *ROOT.glob("*.egg-info"), *(ROOT / "storage_native").glob("_commitlog*.so")]:
        say(f"removing {path}")
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="build.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("setup", help="create .venv, install, build the C extension")
    p.add_argument("--force", action="store_true", help="reinstall and rebuild even if up to date")
    p.set_defaults(func=cmd_setup)
    p = sub.add_parser("run", help="set up, then start name server + broker + gateway with a demo")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="arguments for `sparkmq dev`")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("test", help="set up, then run the whole test suite (extra args go to pytest)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="arguments for pytest")
    p.set_defaults(func=cmd_test)
    p = sub.add_parser("bench", help="run benchmarks (all groups, or one)")
    p.add_argument("group", nargs="?", help="e.g. store")
    p.add_argument("--quick", action="store_true", help="small sizes, for CI smoke runs")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("jars", help="fetch jar sets of conf/jars.toml (all, or the ones named) into the jar cache")
    p.add_argument("sets", nargs="*", help="e.g. delta")
    p.set_defaults(func=cmd_jars)
    p = sub.add_parser("clean", help="remove build products")
    p.set_defaults(func=cmd_clean)
    argv = sys.argv[1:] if argv is None else list(argv)
    # Everything after `run` / `test` belongs to sparkmq dev / pytest, options included
    # (argparse's REMAINDER refuses one that starts with a dash: `test -m "not slow"`).
    passthrough = argv[1:] if argv[:1] in (["run"], ["test"]) and argv[1:2] not in (["-h"], ["--help"]) else None
    if passthrough is not None:
        args = parser.parse_args(argv[:1])
        args.extra = passthrough
    elif argv[:1] == ["bench"]:
        # Options build.py does not know (--minutes) go to the group's script.
        args, args.extra = parser.parse_known_args(argv)
    else:
        args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
