"""A pytest plugin: a failure whose report pytest cannot format is still reported as a failure.

CPython 3.11's AST constructor keeps its recursion depth in state shared by all threads (gh-106905), so an
``ast.parse`` racing another thread's -- pytest reads a failing test's source files to show them, while a
client or Spark thread formats a traceback of its own -- can raise ``SystemError: AST constructor recursion
depth mismatch``.  Raised while pytest builds the report, it became an INTERNALERROR that ended an xdist
worker and the whole run.  Here the report is built again from Python's own traceback formatting instead.
"""
from __future__ import annotations

import traceback
from collections.abc import Generator

import pytest
from _pytest.reports import TestReport
from _pytest.runner import CallInfo


def _plain_traceback(call: CallInfo[None]) -> str:
    if call.excinfo is None:
        return "(no exception recorded)"
    try:
        return "".join(traceback.format_exception(call.excinfo.value))
    except Exception:  # the same race can strike here: the exception's repr is still the failure
        return f"{call.excinfo.typename}: {call.excinfo.value!r}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: CallInfo[None]) -> Generator[None, TestReport, TestReport]:
    """Build the report; when pytest's formatting raises SystemError, a failed report with a plain traceback."""
    try:
        return (yield)
    except SystemError as exc:
        longrepr = (f"{_plain_traceback(call)}\n(pytest could not format this failure: {exc!r}; "
                    "shown with Python's traceback instead)")
        return TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed", longrepr,
                          call.when, duration=call.duration, start=call.start, stop=call.stop,
                          user_properties=item.user_properties)
