"""The soak harness's analysis: pure functions over the samples it records (``bench_soak.py`` writes them).

Kept apart from the harness so that tests can run them on samples they make (tests/test_soak_harness.py),
and so that a CSV of an earlier run can be judged again::

    samples = read_samples(Path("var/bench/soak-latest.csv"))
    growth = rss_growth(samples, brokers=["broker-a"], duration_s=1800)

A sample is one row of the CSV: ``t_s`` (seconds since the steady load began) and one column per figure
(``<broker>_rss_kb``, ``<broker>_pid``, ``lag``, ``overdue``, ...).  Empty cells (a broker that was down,
a group that was away) read as None.  Standard library only.
"""
from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BrokerGrowth", "Recovery", "RssGrowth", "Windows", "broker_growth", "minute_p99s", "percentile",
           "read_samples", "recoveries", "rss_growth", "rss_windows", "worst_over_median", "write_samples"]

Sample = dict[str, float | None]

#: The issue's windows for a 30-minute run: RSS of minutes 5-15 against the last 10 minutes.
REFERENCE_DURATION_S = 30 * 60
EARLY_WINDOW_S = (5 * 60, 15 * 60)
LATE_WINDOW_S = 10 * 60


# -- samples on disk ---------------------------------------------------------------------------------------------
def write_samples(path: Path, samples: Sequence[Mapping[str, float | int | str | None]]) -> None:
    """Write ``samples`` as a CSV, one row each; the columns are every key seen, ``t_s`` first, None as empty."""
    columns = ["t_s"] + sorted({key for sample in samples for key in sample} - {"t_s"})
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, columns)
        writer.writeheader()
        for sample in samples:
            writer.writerow({key: "" if sample.get(key) is None else sample.get(key) for key in columns})


def read_samples(path: Path) -> list[Sample]:
    """The rows of a CSV written by :func:`write_samples`: numbers as floats, empty cells as None."""
    with path.open(newline="") as src:
        return [{key: (float(value) if value not in ("", None) else None) for key, value in row.items()}
                for row in csv.DictReader(src)]


# -- percentiles ------------------------------------------------------------------------------------------------
def percentile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank method; NaN when there are none."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def minute_p99s(latencies: Iterable[tuple[float, float]], duration_s: float) -> list[float]:
    """p99 of the e2e latencies (``(t_s, ms)`` pairs) of each whole minute of ``[0, duration_s)``.

    A minute without a single delivery gets NaN: nothing was consumed, which :func:`worst_over_median`
    counts as the worst minute there can be rather than skipping it.
    """
    minutes = max(1, math.ceil(duration_s / 60))
    buckets: list[list[float]] = [[] for _ in range(minutes)]
    for t_s, ms in latencies:
        if 0 <= t_s < minutes * 60:
            buckets[int(t_s // 60)].append(ms)
    return [percentile(bucket, 0.99) for bucket in buckets]


def worst_over_median(p99s: Sequence[float]) -> float:
    """The worst minute's p99 over the median minute's: how far the tail of one bad minute stands out.

    A minute with NaN (no deliveries) makes the ratio infinite; no minutes at all give NaN.
    """
    if not p99s:
        return math.nan
    if any(math.isnan(v) for v in p99s):
        return math.inf
    median = statistics.median(p99s)
    return max(p99s) / median if median > 0 else math.inf


# -- RSS growth -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Windows:
    """The two windows RSS is compared over, in seconds since the steady load began."""

    early: tuple[float, float]
    late: tuple[float, float]

    def describe(self) -> str:
        """E.g. ``min 5.0-15.0 vs 20.0-30.0``."""
        (a, b), (c, d) = self.early, self.late
        return f"min {a / 60:.1f}-{b / 60:.1f} vs {c / 60:.1f}-{d / 60:.1f}"


def rss_windows(duration_s: float) -> Windows:
    """The issue's windows (minutes 5-15 vs the last 10 of 30) scaled to a run of ``duration_s`` seconds."""
    scale = duration_s / REFERENCE_DURATION_S
    early = (EARLY_WINDOW_S[0] * scale, EARLY_WINDOW_S[1] * scale)
    return Windows(early, (duration_s - LATE_WINDOW_S * scale, duration_s))


@dataclass(frozen=True)
class BrokerGrowth:
    """One broker's RSS growth: percent, or None with the reason it could not be judged."""

    broker: str
    pct: float | None
    reason: str = ""


@dataclass(frozen=True)
class RssGrowth:
    """The run's RSS growth: the worst broker that lived through both windows, and every broker's figure."""

    pct: float
    windows: Windows
    brokers: tuple[BrokerGrowth, ...]

    def passed(self, limit_pct: float) -> bool:
        """Whether the worst growth is within ``limit_pct`` (NaN -- nothing measurable -- never passes)."""
        return not math.isnan(self.pct) and self.pct <= limit_pct


def _in(sample: Sample, window: tuple[float, float]) -> bool:
    t = sample["t_s"]
    return t is not None and window[0] <= t <= window[1]


def broker_growth(samples: Sequence[Sample], broker: str, windows: Windows) -> BrokerGrowth:
    """Growth of ``broker``'s mean RSS from the early window to the late one, in percent.

    A broker whose pid changed between the start of the early window and the end of the late one was
    restarted: a new process's RSS says nothing about the old one's growth, so it is not judged.
    """
    span = [s for s in samples if _in(s, (windows.early[0], windows.late[1])) and s.get(f"{broker}_rss_kb")]
    pids = {s.get(f"{broker}_pid") for s in span}
    if len(pids) > 1:
        return BrokerGrowth(broker, None, "restarted")
    early = [s[f"{broker}_rss_kb"] for s in span if _in(s, windows.early)]
    late = [s[f"{broker}_rss_kb"] for s in span if _in(s, windows.late)]
    if not early or not late:
        return BrokerGrowth(broker, None, "no samples in a window")
    return BrokerGrowth(broker, (statistics.fmean(late) / statistics.fmean(early) - 1) * 100)  # type: ignore[arg-type]


def rss_growth(samples: Sequence[Sample], brokers: Sequence[str], duration_s: float) -> RssGrowth:
    """RSS growth of each broker over the scaled windows (:func:`rss_windows`); ``pct`` is the worst one judged.

    NaN when no broker could be judged (a run too short for both windows to hold samples).
    """
    windows = rss_windows(duration_s)
    figures = tuple(broker_growth(samples, broker, windows) for broker in brokers)
    judged = [g.pct for g in figures if g.pct is not None]
    return RssGrowth(max(judged) if judged else math.nan, windows, figures)


# -- recovery after disturbances --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recovery:
    """How a series came back to 0 after one disturbance: seconds after it, or None if not within the window."""

    event: str
    at_s: float
    after_s: float | None
    complete: bool = True  # False: the samples end before the window does (a run cut short)

    @property
    def recovered(self) -> bool:
        """Whether the series was back at 0 within the window."""
        return self.after_s is not None


def recoveries(samples: Sequence[Sample], column: str, events: Sequence[tuple[str, float]],
               window_s: float = 60.0) -> list[Recovery]:
    """For each ``(name, t_s)`` event: the first sample after it, within ``window_s``, whose ``column`` is 0.

    Only a sample taken after the event counts (a 0 seen before it proves nothing about the recovery), and a
    missing value (None: nothing could be measured) is not a 0.
    """
    found = []
    last_t = max((s["t_s"] for s in samples if s["t_s"] is not None), default=-math.inf)
    for name, at in events:
        after = next((s["t_s"] - at for s in samples  # type: ignore[operator]
                      if s["t_s"] is not None and at < s["t_s"] <= at + window_s and s.get(column) == 0), None)
        found.append(Recovery(name, at, after, complete=after is not None or last_t >= at + window_s))
    return found
