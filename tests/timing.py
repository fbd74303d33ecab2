"""Timing comparisons on a shared machine (the ``serial`` tests).

Each such test measures a figure with and without a disturbance, interleaved, in the same run.  Another tenant's
burst can still land on the disturbed half of one whole measurement; a regression in sparkmq shows in every
measurement.  So a comparison is made up to :data:`ATTEMPTS` times and holds when one measurement meets its
bound; every measurement is printed, and all of them are in the failure message when none does.  Only the bound
is retried: a wrong result inside a measurement (a lost message, a closed connection) fails at once.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

Figures = TypeVar("Figures")

#: How many measurements a timing comparison may take.
ATTEMPTS = 3


def holds_in_one_of(measure: Callable[[int], Figures], holds: Callable[[Figures], bool],
                    describe: Callable[[Figures], str], attempts: int = ATTEMPTS) -> Figures:
    """Call ``measure(attempt)`` until ``holds`` of its figures is true (at most ``attempts`` times); the figures
    that held.  Raises AssertionError describing every measurement when none held."""
    seen = []
    for attempt in range(attempts):
        figures = measure(attempt)
        print(f"measurement {attempt + 1} of at most {attempts}: {describe(figures)}", flush=True)
        if holds(figures):
            return figures
        seen.append(describe(figures))
    raise AssertionError(f"the bound was missed in all {attempts} measurements:\n" + "\n".join(seen))
