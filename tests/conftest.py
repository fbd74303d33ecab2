"""Shared fixtures: the storage implementations and store factories."""
from __future__ import annotations

import ctypes
import importlib
import mmap
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import cpu_accounting
import pytest
from report_guard import pytest_runtest_makereport  # noqa: F401  (a hook: registered by its name here)

from procs import SLOWNESS, TEST_SPARK_SQL_CONF
from sparkmq.storage_native import implementations

IMPLS = implementations()
#: Run the store suites on every implementation that is importable; CI builds both, and a missing native one
#: fails the run there (pytest_configure) instead of leaving its half of the store suites out.
IMPL_NAMES = sorted(IMPLS)

# Child processes (crash tests) must import the same sparkmq.
os.environ.setdefault("PYTHONUNBUFFERED", "1")
# The official RocketMQ client runs gRPC in this process, and the shared SparkSession's JVM is launched
# with a real fork (PySpark's preexec_fn): gRPC's fork handlers could hang it.  Children inherit this too.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


def need(what: str, ok: bool, why: str, *, module: bool = False) -> None:
    """Skip without ``what`` -- but under CI=true fail: a missing dependency (a JDK, a jar, the browser) must
    not pass unnoticed.  ``module``: called at a test module's top level (skips or fails the whole module)."""
    if ok:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is needed under CI: {why}", pytrace=False)
    pytest.skip(f"{what}: {why}", allow_module_level=module)


def need_module(name: str) -> ModuleType:
    """The module ``name``, imported; like ``pytest.importorskip``, but under CI=true its absence fails."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        need(name, False, f"it does not import ({exc})", module=True)
        raise   # need() has skipped or failed


@pytest.fixture(params=IMPL_NAMES)
def impl(request: pytest.FixtureRequest):
    """Each storage implementation module in turn (``_commitlog`` and ``pycommitlog``)."""
    return IMPLS[request.param]


@pytest.fixture
def python_exe() -> str:
    """The interpreter running the tests (for child processes)."""
    return sys.executable


@pytest.fixture
def store_factory(tmp_path: Path) -> Iterator[Callable[..., object]]:
    """Make started MessageStores under tmp_path; shuts them down after the test."""
    from sparkmq.platform.store import MessageStore, StoreConfig

    opened: list[MessageStore] = []

    def make(name: str = "store", impl_module=None, **overrides):
        cfg = StoreConfig(root=tmp_path / name, **{"segment_size": 1 << 20, "max_message_size": 64 * 1024,
                                                    "max_properties_size": 8000, **overrides})
        store = MessageStore(cfg, commit_log_class=impl_module.CommitLog if impl_module else None)
        opened.append(store.start())
        return store

    yield make
    for store in opened:
        store.shutdown()


# ---- Processes: the one harness (tests/procs.py) and the cluster marker ----

#: Fixtures that start real processes; a test using one (directly or through another fixture) is a cluster test.
PROCESS_FIXTURES = frozenset({"procs", "module_procs"})


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[object]:
    """A :class:`procs.ProcessHarness` under tmp_path; every process it started is stopped (by pid) after the test."""
    from procs import TEST_JAVA_OPTIONS, ProcessHarness

    harness = ProcessHarness(tmp_path, TEST_JAVA_OPTIONS)
    yield harness
    harness.stop_all()


@pytest.fixture(scope="module")
def module_procs(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[object]:
    """A :class:`procs.ProcessHarness` for services a whole module shares; stopped (by pid) after the module."""
    from procs import TEST_JAVA_OPTIONS, ProcessHarness

    harness = ProcessHarness(tmp_path_factory.mktemp(request.module.__name__.removeprefix("test_")), TEST_JAVA_OPTIONS)
    yield harness
    harness.stop_all()


#: The test files that take minutes, longest first (from the suite's ``--durations`` in CI runs).  The collection
#: starts with them, so the two workers of ``build.py test`` (``--dist loadfile --no-loadscope-reorder``: xdist hands
#: out whole files in collection order, one more whenever a worker has two tests or fewer left) begin with the long
#: files and end on short ones, instead of one worker running a five-minute file alone at the end.  A file that
#: becomes slow belongs here; an approximate place is enough.
SLOW_FILES = (
    "test_notebooks.py",
    "test_console.py",
    "test_lake_crash.py",
    "test_lake_standalone.py",
    "test_ha.py",
    "test_lake_dispatch.py",
    "test_lake_tables.py",
    "test_acl_cluster.py",
    "test_java_clients.py",
    "test_lake_broker.py",
    "test_grpc_consume.py",
    "test_fuzz_http.py",
    "test_java_harness.py",
    "test_lake_resilience.py",
    "test_lake_maintenance.py",
    "test_fuzz_remoting.py",
    "test_lake_delta.py",
    "test_disk_watermarks.py",
    "test_lake_reports.py",
    "test_cli_sql.py",
    "test_types.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts processes through the harness is marked ``cluster`` even if its module forgot to say so,
    so ``-m "not cluster"`` never runs one.  (Tests that start children another way carry the mark themselves.)
    A test's time limit (``@pytest.mark.timeout``) stretches by :data:`procs.SLOWNESS` on a slow day.
    The files of :data:`SLOW_FILES` come first, in that order; every file's tests keep their order."""
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())) and not item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.cluster)
        limit = item.get_closest_marker("timeout")
        if limit is not None and SLOWNESS > 1.0:  # a slow day stretches the limit as it stretches the waits
            seconds = limit.kwargs.get("timeout", limit.args[0] if limit.args else None)
            if seconds:
                item.add_marker(pytest.mark.timeout(float(seconds) * SLOWNESS), append=False)
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FILES)))   # stable: the rest keep their order


# ---- Spark: one SparkSession for the whole test run (added with the lake foundations) ----
# Session-scoped because a SparkSession takes about 5 s to start on this machine; every
# test marked @pytest.mark.spark shares it.  Settings come from pipelines.session.


@pytest.fixture(scope="session")
def spark():
    """The run's one SparkSession (local[2], UTC, Arrow on, TEST_SPARK_SQL_CONF); stopped when the run ends."""
    from sparkmq.pipelines.session import get_spark, stop_spark

    session = get_spark({"spark.master": "local[2]", **TEST_SPARK_SQL_CONF}, app_name="sparkmq-tests",
                        log_level="ERROR")
    yield session
    stop_spark()


def _running_queries() -> list[Any]:
    """The streaming queries active in the run's SparkSession (none if no test started it)."""
    from sparkmq.pipelines import session as spark_session

    session = spark_session._session
    return [] if session is None else list(session.streams.active)


def _stop_and_name(queries: list[Any]) -> list[str]:
    for query in queries:
        query.stop()
    return [query.name or str(query.id) for query in queries]


# The run's SparkSession outlives every test: a forgotten streaming query keeps polling its source on the worker's
# JVM (in one CI run half a core for the rest of the run, while unrelated tests ran beside it).  A test or module
# that leaves one running fails, and the query is stopped.
@pytest.fixture(autouse=True)
def no_streaming_query_left_by_the_test():
    """Fail a test that started a streaming query and left it running."""
    before = {query.id for query in _running_queries()}
    yield
    left = [query for query in _running_queries() if query.id not in before]
    assert not left, f"streaming queries left running by the test: {_stop_and_name(left)}"


@pytest.fixture(autouse=True, scope="module")
def no_streaming_query_left_by_the_module():
    """Fail a module whose fixtures left a streaming query running."""
    yield
    left = _running_queries()
    assert not left, f"streaming queries left running by the module: {_stop_and_name(left)}"


def resident_pages(path: Path) -> list[bool]:
    """Which pages of ``path`` are in the page cache (mincore over a fresh read-only mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size = path.stat().st_size
    pages = (size + 4095) // 4096
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        vec = ctypes.create_string_buffer(pages)
        try:
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return [bool(b & 1) for b in vec.raw]


def pytest_configure(config: pytest.Config) -> None:
    """Each test's CPU time in the reports (:mod:`cpu_accounting`: a plugin, for its own configure and teardown).
    Under CI=true the native commit log must import: without it the store suites would run on one implementation."""
    config.pluginmanager.register(cpu_accounting, "sparkmq-cpu-accounting")
    if os.environ.get("CI", "").lower() == "true" and "native" not in IMPLS:
        raise pytest.UsageError("the native commit log (sparkmq.storage_native._commitlog) does not import; "
                                "python3 build.py setup builds it")


# -- exit ---------------------------------------------------------------------------------------------------------
_exit_status: int | None = None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remember the session's status for :func:`pytest_unconfigure`."""
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave with the tests' status once pytest is done, skipping the interpreter's finalization.

    The suite's process hosts native runtimes with their own threads (delta-rs's tokio pool, gRPC's pollers
    for the official RocketMQ client, the JVM's py4j gateway); tearing down the interpreter under them has
    crashed the process with SIGSEGV after every test had passed, turning a green run red.  The exit
    handlers still run (they stop the SparkSession and any child process registered with atexit).
    """
    if _exit_status is None or os.environ.get("SPARKMQ_TEST_NORMAL_EXIT"):
        return
    if hasattr(config, "workerinput"):  # an xdist worker: its controller reads its last messages as it exits
        return
    import atexit
    import faulthandler
    faulthandler.enable(all_threads=True)   # should an exit handler itself crash, say where
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)
