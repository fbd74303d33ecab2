"""Alert rules over the per-minute reports: rows in ``alerts``, a webhook POST, and ``/alerts``.

Rules come from the configuration (TOML)::

    [alerts]
    webhook_url = "http://ops.example:8080/hook"

    [[alerts.rules]]
    name = "orders-lag"
    kind = "lag"              # lag | idle_group | dlq_growth
    threshold = 1000          # lag: messages behind; idle_group: lag that makes idleness matter;
                              # dlq_growth: messages_in of a %DLQ% topic in one window
    for_minutes = 5           # the condition must hold in each of the last N report windows
    severity = "critical"     # info | warning (default) | critical
    group = "order-*"         # optional filters (exact names or fnmatch globs)
    topic = "orders"

What each kind watches (``W`` = the newest reported window, ``M`` = ``for_minutes``):

* ``lag`` -- per (group, topic): the lag summed over brokers and queues at the end of each
  of the last M windows is above ``threshold``.
* ``idle_group`` -- per group: its committed offsets did not move in the last M windows
  (``messages_out`` summed is 0; the window before them must have a row too, because a
  group's first row has no baseline and always shows 0) while its lag stayed above
  ``threshold``: a group that consumes nothing although there is something to consume.
* ``dlq_growth`` -- per ``%DLQ%`` topic (summed over brokers): ``messages_in`` above
  ``threshold`` in each of the last M windows.  Its ``group`` filter matches the group
  the DLQ belongs to (``%DLQ%<group>``), ``topic`` the DLQ topic's full name.

An alert is raised once: a row in ``alerts`` with ``alert_id = "<rule>:<subject>"`` and
``resolved_at`` NULL, and one POST of that row (JSON) to ``webhook_url``.  While it is
open nothing more is written.  It is resolved when the newest window shows the condition
cleared -- only on evidence: a group missing from the newest window (its broker did not
answer) keeps its alert open -- by a delta-spark MERGE that sets ``resolved_at`` on the open
row, and the resolved row is POSTed too (``"event": "resolved"``).  The same subject may
fire again later: a new row with the same ``alert_id`` and a later ``raised_at``.

Webhook failures are logged and retried on the next evaluation, never raised; the
queue of unsent notifications lives in memory (a process restart drops it).

:func:`open_alerts` is what the broker's ``GET /alerts`` answers (delta-rs only, no Spark).
"""
from __future__ import annotations

import datetime as dt
import fnmatch
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable
from msgspec import Meta

from sparkmq.platform.common.validation import Positive, check_fields

from . import tables

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "ALERT_KINDS",
    "AlertConfig",
    "AlertEngine",
    "AlertResult",
    "AlertRule",
    "SEVERITIES",
    "open_alerts",
]

log = logging.getLogger("sparkmq.lake.alerts")

UTC = dt.UTC
_TS = pa.timestamp("us", tz="UTC")
_WINDOW = dt.timedelta(minutes=1)

ALERT_KINDS = ("lag", "idle_group", "dlq_growth")
SEVERITIES = ("info", "warning", "critical")
DLQ_PREFIX = "%DLQ%"
#: Unsent webhook notifications kept for retry; beyond this the oldest are dropped (and logged).
MAX_PENDING_NOTIFICATIONS = 1000


@dataclass(frozen=True)
class AlertRule:
    """One rule: ``kind`` over the reports, firing when the value exceeds ``threshold`` for ``for_minutes``."""

    name: str
    kind: str
    threshold: Annotated[float, Meta(ge=0)] = 0.0
    for_minutes: Positive = 1
    severity: str = "warning"
    group: str | None = None      # exact name or fnmatch glob; None: every group
    topic: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or ":" in self.name:
            raise ValueError(f"alert rule name must be a non-empty string without ':', got {self.name!r}")
        if self.kind not in ALERT_KINDS:
            raise ValueError(f"alert rule {self.name!r}: kind must be one of {ALERT_KINDS}, got {self.kind!r}")
        check_fields(self, prefix=f"alert rule {self.name!r}: ")  # threshold, for_minutes
        if self.severity not in SEVERITIES:
            raise ValueError(f"alert rule {self.name!r}: severity must be one of {SEVERITIES}, got {self.severity!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> AlertRule:
        """From one ``[[alerts.rules]]`` table; unknown keys are an error (a typo must not disable a rule)."""
        known = {"name", "kind", "threshold", "for_minutes", "severity", "group", "topic"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"alert rule {data.get('name')!r}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**dict(data))

    def matches(self, group: str | None = None, topic: str | None = None) -> bool:
        """Whether a subject passes the rule's group / topic filters."""
        if self.group is not None and (group is None or not fnmatch.fnmatchcase(group, self.group)):
            return False
        return not (self.topic is not None and (topic is None or not fnmatch.fnmatchcase(topic, self.topic)))


@dataclass(frozen=True)
class AlertConfig:
    """The ``[alerts]`` configuration: rules and where to POST."""

    rules: tuple[AlertRule, ...] = ()
    webhook_url: str | None = None
    webhook_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        names = [r.name for r in self.rules]
        if len(set(names)) != len(names):
            raise ValueError(f"alert rule names must be unique, got {names}")

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any]) -> AlertConfig:
        """From the whole conf (with an ``alerts`` table) or the ``alerts`` table itself."""
        section = conf.get("alerts", conf) if isinstance(conf.get("alerts"), Mapping) else conf
        rules = tuple(AlertRule.from_mapping(r) for r in section.get("rules") or ())
        return cls(rules=rules, webhook_url=section.get("webhook_url") or None,
                   webhook_timeout_s=float(section.get("webhook_timeout_s", 5.0)))


@dataclass
class AlertResult:
    """What one evaluation did."""

    raised: list[dict[str, Any]] = field(default_factory=list)
    resolved: list[dict[str, Any]] = field(default_factory=list)
    notified: int = 0               # webhook POSTs that succeeded (this run, retries included)
    notify_failures: int = 0
    pending: int = 0                # notifications waiting for a retry


@dataclass(frozen=True)
class _Finding:
    subject: str
    state: str                      # "active" | "clear" | "unknown"
    value: float | None
    detail: str


# -- reading the reports -----------------------------------------------------------------------

def _read_window_range(spark: SparkSession, lake_root: str, name: str, columns: list[str], start: dt.datetime,
                       end: dt.datetime) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    df = (spark.read.format("delta").load(tables.table_path(lake_root, name))
          .where((F.col("window_start") >= F.lit(start)) & (F.col("window_start") < F.lit(end))).select(*columns))
    return df.toArrow().to_pylist()  # Arrow keeps timestamps UTC-aware


def _windows(latest: dt.datetime, n: int) -> list[dt.datetime]:
    """The ``n`` windows ending with ``latest``, newest first."""
    return [latest - _WINDOW * i for i in range(n)]


def _eval_lag(rule: AlertRule, rows: Sequence[Mapping[str, Any]], latest: dt.datetime) -> list[_Finding]:
    series: dict[tuple[str, str], dict[dt.datetime, int]] = {}
    for r in rows:
        if rule.matches(r["group"], r["topic"]):
            s = series.setdefault((r["group"], r["topic"]), {})
            s[r["window_start"]] = s.get(r["window_start"], 0) + r["lag"]
    out = []
    for (group, topic), by_window in sorted(series.items()):
        subject = f"group={group} topic={topic}"
        wanted = _windows(latest, rule.for_minutes)
        if latest not in by_window:
            out.append(_Finding(subject, "unknown", None, ""))
            continue
        value = by_window[latest]
        if all(w in by_window and by_window[w] > rule.threshold for w in wanted):
            state = "active"
        elif value <= rule.threshold:
            state = "clear"
        else:
            state = "unknown"       # above now, but not yet for long enough
        out.append(_Finding(subject, state, float(value),
                            f"lag of group {group} on {topic} is {value} (> {rule.threshold:g} for "
                            f"{rule.for_minutes} min), window {latest.isoformat()}"))
    return out


def _eval_idle(rule: AlertRule, rows: Sequence[Mapping[str, Any]], latest: dt.datetime) -> list[_Finding]:
    series: dict[str, dict[dt.datetime, list[int]]] = {}
    for r in rows:
        if rule.matches(r["group"], r["topic"]):
            s = series.setdefault(r["group"], {}).setdefault(r["window_start"], [0, 0])
            s[0] += r["messages_out"]
            s[1] += r["lag"]
    out = []
    for group, by_window in sorted(series.items()):
        subject = f"group={group}"
        if latest not in by_window:
            out.append(_Finding(subject, "unknown", None, ""))
            continue
        consumed, lag = by_window[latest]
        wanted = _windows(latest, rule.for_minutes + 1)   # + the baseline window before them
        if all(w in by_window for w in wanted) and all(
                by_window[w][0] == 0 and by_window[w][1] > rule.threshold for w in wanted[:-1]):
            state = "active"
        elif consumed > 0 or lag <= rule.threshold:
            state = "clear"
        else:
            state = "unknown"
        out.append(_Finding(subject, state, float(lag),
                            f"group {group} consumed nothing for {rule.for_minutes} min with lag {lag} "
                            f"(> {rule.threshold:g}), window {latest.isoformat()}"))
    return out


def _eval_dlq(rule: AlertRule, rows: Sequence[Mapping[str, Any]], latest: dt.datetime,
              open_subjects: Iterable[str]) -> list[_Finding]:
    series: dict[str, dict[dt.datetime, int]] = {}
    for r in rows:
        topic = r["topic"]
        if topic.startswith(DLQ_PREFIX) and rule.matches(topic[len(DLQ_PREFIX):], topic):
            s = series.setdefault(topic, {})
            s[r["window_start"]] = s.get(r["window_start"], 0) + r["messages_in"]
    for subject in open_subjects:   # a DLQ that stopped growing has no rows: that is the evidence
        series.setdefault(subject.removeprefix("topic="), {})
    out = []
    for topic, by_window in sorted(series.items()):
        value = by_window.get(latest, 0)   # no row: nothing came in
        if all(by_window.get(w, 0) > rule.threshold for w in _windows(latest, rule.for_minutes)):
            state = "active"
        elif value <= rule.threshold:
            state = "clear"
        else:
            state = "unknown"
        out.append(_Finding(f"topic={topic}", state, float(value),
                            f"{value} messages went to {topic} in window {latest.isoformat()} "
                            f"(> {rule.threshold:g} for {rule.for_minutes} min)"))
    return out


# -- the alerts table ----------------------------------------------------------------------------

def _alerts_path(lake_root: str) -> str:
    return tables.table_path(lake_root, tables.ALERTS)


def _json_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in row.items()}


def open_alerts(lake_root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every open alert (``resolved_at`` NULL), oldest first, JSON-ready (timestamps as ISO 8601 strings).

    Reads the ``alerts`` table with delta-rs only (cheap enough for an HTTP handler); an
    absent table means no alerts.
    """
    path = _alerts_path(os.fspath(lake_root))
    if not DeltaTable.is_deltatable(path):
        return []
    rows = DeltaTable(path).to_pyarrow_dataset().to_table(filter=ds.field("resolved_at").is_null())
    return [_json_row(r) for r in rows.sort_by([("raised_at", "ascending"), ("alert_id", "ascending")]).to_pylist()]


def _open_rows(spark: SparkSession, lake_root: str) -> dict[str, dict[str, Any]]:
    # toArrow, not collect: Arrow keeps timestamps UTC-aware (collect gives naive local times).
    rows = spark.read.format("delta").load(_alerts_path(lake_root)).where("resolved_at IS NULL").toArrow()
    return {r["alert_id"]: r for r in rows.to_pylist()}


# -- the engine ------------------------------------------------------------------------------------

class AlertEngine:
    """Evaluates the rules after each report, writes ``alerts`` and calls the webhook.

    Keep one per process (it holds the webhook retry queue); :meth:`evaluate` is not meant
    to run concurrently with itself (the :class:`~.reports.Reporter` serialises runs).
    """

    def __init__(self, spark: SparkSession, lake_root: str | os.PathLike[str], config: AlertConfig, *,
                 transport: httpx.BaseTransport | None = None) -> None:
        """``spark`` reads the reports and writes ``alerts``; ``transport`` replaces the network for the webhook
        (tests)."""
        self.spark = spark
        self.lake_root = os.fspath(lake_root)
        self.config = config
        self._transport = transport
        self._pending: list[dict[str, Any]] = []

    @property
    def pending(self) -> int:
        """Notifications waiting for a retry."""
        return len(self._pending)

    def evaluate(self, latest_window: dt.datetime, now: dt.datetime | None = None) -> AlertResult:
        """Evaluate every rule on the reports up to ``latest_window``; raise, resolve, notify."""
        now = (now or dt.datetime.now(UTC)).astimezone(UTC)
        tables.ensure_tables(self.spark, self.lake_root, [tables.ALERTS, tables.GROUP_STATS, tables.TOPIC_STATS])
        result = AlertResult()
        rules = self.config.rules
        if rules:
            findings = self._findings(latest_window)
            open_rows = _open_rows(self.spark, self.lake_root)
            raised, resolved = [], []
            for rule in rules:
                prefix = f"{rule.name}:"
                for f in findings[rule.name]:
                    alert_id = prefix + f.subject
                    if f.state == "active" and alert_id not in open_rows:
                        raised.append({"alert_id": alert_id, "rule": rule.name, "subject": f.subject,
                                       "severity": rule.severity, "value": f.value,
                                       "threshold": float(rule.threshold), "raised_at": now, "resolved_at": None,
                                       "detail": f.detail})
                    elif f.state == "clear" and alert_id in open_rows:
                        resolved.append({**open_rows[alert_id], "resolved_at": now})
            if raised:
                (self.spark.createDataFrame(pa.Table.from_pylist(raised, schema=tables.get_spec(tables.ALERTS).schema),
                                            schema=tables.spark_schema(tables.ALERTS))
                 .write.format("delta").mode("append").save(_alerts_path(self.lake_root)))
                for row in raised:
                    log.warning("alert raised: %s (%s) %s", row["alert_id"], row["severity"], row["detail"])
            if resolved:
                self._resolve(resolved)
                for row in resolved:
                    log.info("alert resolved: %s", row["alert_id"])
            result.raised, result.resolved = raised, resolved
            self._pending.extend({**_json_row(r), "event": "raised"} for r in raised)
            self._pending.extend({**_json_row(r), "event": "resolved"} for r in resolved)
        self._notify(result)
        return result

    def _findings(self, latest: dt.datetime) -> dict[str, list[_Finding]]:
        rules = self.config.rules
        span = max(r.for_minutes for r in rules) + 1
        start, end = latest - _WINDOW * (span - 1), latest + _WINDOW
        group_rows: list[dict[str, Any]] = []
        topic_rows: list[dict[str, Any]] = []
        if any(r.kind in ("lag", "idle_group") for r in rules):
            group_rows = _read_window_range(self.spark, self.lake_root, tables.GROUP_STATS,
                                            ["window_start", "group", "topic", "messages_out", "lag"], start, end)
        open_by_rule: dict[str, list[str]] = {}
        if any(r.kind == "dlq_growth" for r in rules):
            topic_rows = _read_window_range(self.spark, self.lake_root, tables.TOPIC_STATS,
                                            ["window_start", "topic", "messages_in"], start, end)
            for row in _open_rows(self.spark, self.lake_root).values():
                open_by_rule.setdefault(row["rule"], []).append(row["subject"])
        out: dict[str, list[_Finding]] = {}
        for rule in rules:
            if rule.kind == "lag":
                out[rule.name] = _eval_lag(rule, group_rows, latest)
            elif rule.kind == "idle_group":
                out[rule.name] = _eval_idle(rule, group_rows, latest)
            else:
                out[rule.name] = _eval_dlq(rule, topic_rows, latest, open_by_rule.get(rule.name, ()))
        return out

    def _resolve(self, resolved: Sequence[Mapping[str, Any]]) -> None:
        from delta.tables import DeltaTable as SparkDeltaTable

        source = self.spark.createDataFrame(
            [(r["alert_id"], r["resolved_at"]) for r in resolved], "alert_id string, resolved_at timestamp")
        # Only the open row of each id: an alert that fired and cleared before keeps its old resolved_at.
        (SparkDeltaTable.forPath(self.spark, _alerts_path(self.lake_root)).alias("t")
         .merge(source.alias("s"), "t.alert_id = s.alert_id AND t.resolved_at IS NULL")
         .whenMatchedUpdate(set={"resolved_at": "s.resolved_at"})
         .execute())

    def _notify(self, result: AlertResult) -> None:
        url = self.config.webhook_url
        if not url:
            self._pending.clear()
            return
        if len(self._pending) > MAX_PENDING_NOTIFICATIONS:
            dropped = len(self._pending) - MAX_PENDING_NOTIFICATIONS
            log.error("alert webhook %s: dropping %d unsent notifications", url, dropped)
            del self._pending[:dropped]
        sent = 0
        try:
            with httpx.Client(timeout=self.config.webhook_timeout_s, transport=self._transport) as client:
                for payload in self._pending:
                    resp = client.post(url, json=payload)
                    resp.raise_for_status()
                    sent += 1
        except Exception as exc:  # never raised: the report ran; the POST is retried next time
            result.notify_failures += 1
            log.warning("alert webhook %s failed (%d notifications wait for the next run): %s",
                        url, len(self._pending) - sent, exc)
        del self._pending[:sent]
        result.notified = sent
        result.pending = len(self._pending)

