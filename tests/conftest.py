"""Shared fixtures: the storage implementations and store factories."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sparkmq.storage_native import implementations

IMPLS = implementations()
#: Run the store suites on every implementation that is importable; CI builds both.
IMPL_NAMES = sorted(IMPLS)

# Child processes (crash tests) must import the same sparkmq.
os.environ.setdefault("PYTHONUNBUFFERED", "1")


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


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[object]:
    """A :class:`procs.ProcessHarness` under tmp_path; every service it started is stopped after the test."""
    from procs import ProcessHarness

    harness = ProcessHarness(tmp_path)
    yield harness
    harness.stop_all()


# ---- Spark: one SparkSession for the whole test run (added with the lake foundations) ----
# Session-scoped because a SparkSession takes about 5 s to start on this machine; every
# test marked @pytest.mark.spark shares it.  Settings come from pipelines.session.


@pytest.fixture(scope="session")
def spark():
    """The run's one SparkSession (local[2], UTC, Arrow on); stopped when the run ends."""
    from sparkmq.pipelines.session import get_spark, stop_spark

    session = get_spark({"spark.master": "local[2]"}, app_name="sparkmq-tests", log_level="ERROR")
    yield session
    stop_spark()
