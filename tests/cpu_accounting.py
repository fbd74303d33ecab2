"""Each test's CPU time, the processes it started included: the JUnit property ``cpu_s`` and a summary.

The suite is CPU-bound on a 2-core machine (both cores busy for most of the parallel phase), so what a test
costs the suite is the CPU it and its brokers, JVMs and browsers use, not its wall time, which depends on what
ran beside it.  Each pytest process moves itself into a cgroup of its own (cgroup v1 ``cpuacct``) when it
starts; processes started later inherit it, so the cgroup's usage across a test, from setup to teardown, is
that test's CPU.  Where cgroups are not writable nothing is measured and nothing else changes.
``SPARKMQ_TEST_CPU_ACCOUNTING=0`` turns it off.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
#: How many of the costliest tests the summary at the end lists.
SUMMARY_TESTS = 25

_group: Path | None = None
_started: float = 0.0
_costs: dict[str, float] = {}


def _usage_s() -> float:
    assert _group is not None
    return int((_group / "cpuacct.usage").read_text()) / 1e9


def pytest_configure(config: pytest.Config) -> None:
    global _group
    if os.environ.get("SPARKMQ_TEST_CPU_ACCOUNTING", "1") == "0" or not CPUACCT.is_dir():
        return
    # Runs whose processes outlived pytest (a JVM stopped by an exit handler) left their cgroups behind, empty
    # now: remove them.  Only an empty cgroup can be removed, so one in use stays.
    for stale in CPUACCT.glob("sparkmq-tests-*"):
        try:
            stale.rmdir()
        except OSError:
            pass
    group = CPUACCT / f"sparkmq-tests-{os.getpid()}"
    for _attempt in range(2):   # a second try: another pytest's clean-up may remove it before this one moves in
        try:
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except FileNotFoundError:
            continue
        except OSError:   # not root, or no cgroup v1 hierarchy: no accounting
            return
        _group = group
        return


def pytest_unconfigure(config: pytest.Config) -> None:
    global _group
    if _group is None:
        return
    try:
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        _group.rmdir()   # refused while a process a test left behind still runs in it: harmless
    except OSError:
        pass
    _group = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):  # noqa: ANN201 (a hook wrapper)
    global _started
    if _group is not None:
        _started = _usage_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201
    yield
    if _group is not None:   # before the teardown's report is made: it carries the property to JUnit
        item.user_properties.append(("cpu_s", round(_usage_s() - _started, 1)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect the figure where the summary is printed (the controller, under xdist)."""
    if report.when == "teardown":
        for name, value in report.user_properties:
            if name == "cpu_s":
                _costs[report.nodeid] = float(value)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _costs:
        return
    terminalreporter.section("CPU per test (its processes included)")
    total = sum(_costs.values())
    for nodeid, cost in sorted(_costs.items(), key=lambda kv: kv[1], reverse=True)[:SUMMARY_TESTS]:
        terminalreporter.write_line(f"{cost:8.1f}s cpu {nodeid}")
    terminalreporter.write_line(f"{total:8.1f}s cpu in all, over {len(_costs)} tests")
