"""The admin client: topics, groups, offsets, lag, cluster and message lookups (RocketMQ's ``mqadmin``).

Topic configs live on brokers, so creating a topic means ``POST /topics`` on every master of
a cluster (or on the brokers given); the brokers then announce it to the name servers with
their next registration.  Group views (members, offsets, lag) are per broker and are
aggregated here over every master in the cluster view.

Example::

    with AdminClient(ClientConfig(namesrv_addrs="127.0.0.1:9876")) as admin:
        admin.create_topic("orders", read_queue_nums=8, write_queue_nums=8)
        print(admin.group_lag("cg").total_lag)
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..common.errors import ErrorCode, SparkMQError
from ..common.ids import decode_offset_msg_id
from ..common.perm import PERM_MAX, PERM_READ_WRITE
from ..common.protocol import REPORT_KINDS, GroupMemberData, ReportSeries, report_range
from ..common.trace import trace_path
from ..common.validation import EpochMs, check, check_int, validate_group, validate_topic
from ..common.wire import ReceivedMessage
from .allocation import MessageQueue
from .config import ClientConfig
from .remoting import BrokerClientPool, NameServerClient
from .routes import MASTER_ID, TopicRouteInfo

__all__ = ["AdminClient", "QueueStats", "QueueLag", "GroupLag", "merge_group_clients"]

log = logging.getLogger("sparkmq.client")

#: How long a leadership transfer request may take (the broker gives up after its election time).
_TRANSFER_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's offsets on its broker."""

    topic: str
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_timestamp: int = 0


@dataclass(frozen=True, slots=True)
class QueueLag:
    """How far a group is behind on one queue."""

    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    lag: int


@dataclass(frozen=True)
class GroupLag:
    """A group's lag over every broker: the total and each queue's."""

    group: str
    total_lag: int
    queues: list[QueueLag] = field(default_factory=list)


class AdminClient:
    """Administration over the name servers and brokers.  Thread-safe; close it (or use ``with``) when done."""

    def __init__(self, config: ClientConfig, *, transport: httpx.BaseTransport | None = None) -> None:
        """``transport`` replaces the network for every request (tests pass ``httpx.MockTransport``)."""
        self.config = config
        self._namesrv = NameServerClient(config.namesrv_addrs, config.request_timeout_s, transport=transport,
                                         credentials=config.credentials, tls=config.tls_settings)
        self._brokers = BrokerClientPool(config.request_timeout_s, transport=transport, credentials=config.credentials,
                                         tls=config.tls_settings)

    def close(self) -> None:
        """Close every connection."""
        self._brokers.close()
        self._namesrv.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- cluster -----------------------------------------------------------------------------------
    def cluster_list(self) -> dict[str, Any]:
        """The name server's cluster view: ``clusters``, ``brokers`` (addresses by id), ``live_brokers``."""
        return self._namesrv.cluster_info()

    def masters(self, cluster: str | None = None) -> dict[str, str]:
        """Broker name -> master address, of one cluster or all; INVALID_ARGUMENT for an unknown cluster."""
        info = self.cluster_list()
        clusters = info.get("clusters") or {}
        if cluster is not None and cluster not in clusters:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"unknown cluster {cluster!r}; known: {sorted(clusters)}")
        names = set(clusters[cluster]) if cluster is not None else set(info.get("brokers") or {})
        out = {}
        for name in sorted(names):
            addrs = ((info.get("brokers") or {}).get(name) or {}).get("broker_addrs") or {}
            master = addrs.get(str(MASTER_ID))
            if master:
                out[name] = master
        return out

    def replication(self, addr: str) -> dict[str, Any]:
        """The replication state of the broker at ``addr`` (``GET /broker/ha``)."""
        return self._brokers.http(addr).replication()

    def dledger_status(self, addr: str) -> dict[str, Any]:
        """The DLedger member of the broker at ``addr`` (``GET /broker/dledger``; DLEDGER_NOT_ENABLED if none)."""
        return self._brokers.http(addr).dledger_status()

    def transfer_leadership(self, addr: str, to_id: str) -> dict[str, Any]:
        """Ask the DLedger leader at ``addr`` to hand the leadership to member ``to_id``; returns once ``to_id``
        leads (``{"from", "to", "leader", "previous_term", "term"}``).

        Errors: SERVICE_NOT_AVAILABLE naming the leader when ``addr`` does not lead, INVALID_ARGUMENT for an
        unknown member, LEADERSHIP_TRANSFER_FAILED when it did not complete within the broker's transfer time.
        Example::

            admin.transfer_leadership("127.0.0.1:10911", "n1")
        """
        # The broker waits up to its election time (seconds with the 2 s default heartbeat): wait longer.
        timeout = max(self.config.request_timeout_s, _TRANSFER_TIMEOUT_S)
        return self._brokers.http(addr).dledger_transfer(to_id, timeout=timeout)

    def broker_info(self, addr: str) -> dict[str, Any]:
        """``GET /broker`` of one broker."""
        return self._brokers.http(addr).broker_info()

    def query_messages(self, *, topic: str | None = None, key: str | None = None, msg_id: str | None = None,
                       begin_ms: int | None = None, end_ms: int | None = None, max_hits: int = 32,
                       cluster: str | None = None) -> list[ReceivedMessage]:
        """Messages found through every master's lake index (by msg_id, topic + key, or topic + time range),
        newest first, at most ``max_hits`` in all."""
        params = {k: v for k, v in {"topic": topic, "key": key, "msg_id": msg_id, "begin": begin_ms,
                                    "end": end_ms, "max": max_hits}.items() if v is not None}
        found: list[ReceivedMessage] = []
        no_lake: SparkMQError | None = None
        answered = 0
        for addr in sorted(self.masters(cluster).values()):
            try:
                found += self._brokers.http(addr).query_messages(params)
                answered += 1
            except SparkMQError as exc:
                if exc.code is not ErrorCode.LAKE_NOT_AVAILABLE:
                    raise
                no_lake = exc  # this broker keeps no index; the others' answers stand
        if not answered and no_lake is not None:
            raise no_lake
        found.sort(key=lambda m: (m.store_timestamp, m.queue_offset), reverse=True)
        return found[:max_hits]

    def trace(self, msg_id: str, cluster: str | None = None) -> list[dict[str, Any]]:
        """A message's whole path: the trace events every master's lake holds for ``msg_id``, merged.

        Events come in time order (send, store, deliver, consume, retry, dlq, transaction), each with
        ``elapsed_ms`` since the previous step and ``since_first_ms``; an event two lakes both hold
        appears once.  Empty until the trace job has written the message's events.
        """

        if not isinstance(msg_id, str) or not msg_id:
            raise SparkMQError(ErrorCode.MESSAGE_ID_ILLEGAL, "the message id must be a non-empty string")
        events: list[dict[str, Any]] = []
        for addr in sorted(self.masters(cluster).values()):
            events += self._brokers.http(addr).trace(msg_id)["events"]
        return trace_path(events)

    def lake_status(self, cluster: str | None = None) -> dict[str, dict[str, Any]]:
        """Each master's lake (from its ``/health``): state and jobs, or ``{"state": "disabled"}``."""
        out: dict[str, dict[str, Any]] = {}
        for name, addr in sorted(self.masters(cluster).items()):
            health = self._brokers.http(addr).health()
            out[name] = health.get("lake") or {"state": "disabled", "jobs": {}}
        return out

    def alerts(self, *, resolved: bool = False, limit: int = 500,
               cluster: str | None = None) -> dict[str, list[dict[str, Any]]]:
        """Each master's alerts (``GET /alerts``: rows of its lake's ``alerts`` table, raised and resolved by the
        report rules), by broker name: the open ones, or with ``resolved`` the newest ``limit`` open and
        resolved.  A broker without a lake answers none.

        Example::

            firing = [a for rows in admin.alerts().values() for a in rows]
        """
        state = "all" if resolved else "open"
        return {name: self._brokers.http(addr).alerts(state, limit)
                for name, addr in sorted(self.masters(cluster).items())}

    def alert_rules(self, cluster: str | None = None) -> dict[str, dict[str, Any]]:
        """Each master's alert rules (``GET /alerts/rules``), by broker name: ``{"rules": [{"name", "kind",
        "threshold", "for_minutes", "severity", "group", "topic"}], "error"}``, as its ``[[alerts.rules]]``
        configure them (none on a broker without a lake; ``error`` when the table does not parse).

        Example::

            names = {r["name"] for answer in admin.alert_rules().values() for r in answer["rules"]}
        """
        return {name: self._brokers.http(addr).alert_rules() for name, addr in sorted(self.masters(cluster).items())}

    def report_series(self, kind: str, name: str, range_name: str = "6h", cluster: str | None = None
                      ) -> ReportSeries:
        """A topic's (``kind`` "topic") or group's ("group") per-minute report rows (``topic_stats`` /
        ``group_stats``) over the last ``range_name`` ("1h", "6h", "24h", "7d"), bucketed and summed over every
        master: messages and TPS in and out, and a group's lag.  No points before the lakes wrote a report.

        Example::

            lag = [(p.t, p.lag) for p in admin.report_series("group", "orders-cg", "24h").points]
        """
        report_range(range_name)
        if kind not in REPORT_KINDS:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"kind must be one of {list(REPORT_KINDS)}, got {kind!r}")
        (validate_topic if kind == "topic" else validate_group)(name)
        series = [self._brokers.http(addr).report(kind, name, range_name)
                  for _, addr in sorted(self.masters(cluster).items())]
        if not series:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, "no live master to read reports from")
        return ReportSeries.merged(series)

    def whoami(self, cluster: str | None = None) -> dict[str, dict[str, Any]]:
        """Who each master takes this client for (``GET /acl/whoami``): ``acl_enabled``, ``access_key``,
        ``super_user``, the user's policy ``entries`` and the ``peer_ip`` it sees, by broker address.

        AUTHENTICATION_FAILED when a master has ACL on and the credentials are missing or wrong.
        """
        return self._on_targets("asking who we are", cluster, lambda b: b.whoami())

    # -- topics -------------------------------------------------------------------------------------
    def _targets(self, cluster: str | None, broker_addrs: Sequence[str] | None) -> list[str]:
        targets = list(broker_addrs) if broker_addrs else sorted(self.masters(cluster).values())
        if not targets:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, "no live master to send the topic config to")
        return targets

    def create_topic(self, topic: str, read_queue_nums: int = 16, write_queue_nums: int = 16,
                     perm: int = PERM_READ_WRITE, order: bool = False, *, cluster: str | None = None,
                     broker_addrs: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """Create or update ``topic`` on every master of ``cluster`` (all clusters when None) or on ``broker_addrs``.

        Returns the stored config by broker address.  Every target is tried; the first failure is
        raised afterwards (the others keep the new config -- run it again to converge).
        """
        validate_topic(topic)
        for name, value, low, high in (("read_queue_nums", read_queue_nums, 1, 65535),
                                       ("write_queue_nums", write_queue_nums, 1, 65535), ("perm", perm, 0, PERM_MAX)):
            check_int(name, value, low, high)
        body = {"topic": topic, "read_queue_nums": read_queue_nums, "write_queue_nums": write_queue_nums,
                "perm": perm, "order": bool(order)}
        out: dict[str, dict[str, Any]] = {}
        error: SparkMQError | None = None
        for addr in self._targets(cluster, broker_addrs):
            try:
                out[addr] = self._brokers.http(addr).create_topic(body)
            except SparkMQError as exc:
                log.warning("creating %s on %s failed: %s", topic, addr, exc)
                error = error or exc
        if error is not None:
            raise error
        return out

    update_topic = create_topic

    def delete_topic(self, topic: str, *, cluster: str | None = None) -> dict[str, dict[str, bool]]:
        """Delete ``topic`` from the masters of ``cluster`` (all when None) and from every name server.

        Returns ``{"brokers": {addr: deleted}, "namesrvs": {addr: deleted}}``.  A broker that refuses the
        caller (NO_PERMISSION, AUTHENTICATION_FAILED) is raised before the name servers are touched: a refused
        delete must not drop the topic's route.
        """
        validate_topic(topic)
        brokers: dict[str, bool] = {}
        refused: SparkMQError | None = None
        for addr in self._targets(cluster, None):
            try:
                brokers[addr] = bool(self._brokers.http(addr).delete_topic(topic).get("deleted"))
            except SparkMQError as exc:
                log.warning("deleting %s on %s failed: %s", topic, addr, exc)
                brokers[addr] = False
                if exc.code in (ErrorCode.NO_PERMISSION, ErrorCode.AUTHENTICATION_FAILED):
                    refused = refused or exc
        if refused is not None:
            raise refused
        params = {"cluster": cluster} if cluster else None
        namesrvs = {addr: (not isinstance(ans, SparkMQError)) and bool(ans.get("deleted"))
                    for addr, ans in self._namesrv.each("DELETE", f"/topics/{topic}", params=params).items()}
        return {"brokers": brokers, "namesrvs": namesrvs}

    def topic_list(self) -> list[str]:
        """Every topic a live broker serves (from a name server), sorted."""
        return self._namesrv.topic_list()

    def topic_route(self, topic: str) -> TopicRouteInfo:
        """``topic``'s route; TOPIC_NOT_EXIST when no live broker serves it."""
        return TopicRouteInfo.from_dict(topic, self._namesrv.topic_route(validate_topic(topic)))

    def topic_stats(self, topic: str) -> list[QueueStats]:
        """Min / max offset and last store time of every queue of ``topic`` on every broker in its route."""
        route = self.topic_route(topic)
        out: list[QueueStats] = []
        for name in route.broker_names:
            addr = route.read_addr(name)
            if addr is None:
                continue
            stats = self._brokers.http(addr).topic_stats(topic)
            out.extend(QueueStats(topic, name, int(q["queue_id"]), int(q["min_offset"]), int(q["max_offset"]),
                                  int(q.get("last_store_timestamp") or 0)) for q in stats.get("queues") or ())
        return sorted(out, key=lambda s: (s.broker_name, s.queue_id))

    # -- access control (docs/security.md) -------------------------------------------------------------
    def _on_targets(self, what: str, cluster: str | None, fn: Any, servers: Sequence[str] | None = None
                    ) -> dict[str, Any]:
        """``fn(client)`` on every master of ``cluster``, or on ``servers`` (``host:port`` of any service with the
        ``/acl`` API: name servers, gateways, brokers); the first failure is raised after all were tried."""
        out: dict[str, Any] = {}
        error: SparkMQError | None = None
        for addr in list(servers) if servers else self._targets(cluster, None):
            try:
                out[addr] = fn(self._brokers.http(addr))
            except SparkMQError as exc:
                log.warning("%s on %s failed: %s", what, addr, exc)
                error = error or exc
        if error is not None:
            raise error
        return out

    # Every ACL method takes ``servers``: the services to manage instead of the masters (name servers and
    # gateways keep ACLs of their own, docs/security.md).
    def create_user(self, access_key: str, secret_key: str, *, super_user: bool = False, update: bool = False,
                    cluster: str | None = None, servers: Sequence[str] | None = None) -> dict[str, Any]:
        """Create (or with ``update`` change) a user on every master; the user (no secret) by broker address."""
        return self._on_targets(f"creating user {access_key}", cluster, lambda b: b.acl_create_user(
            access_key, secret_key, super_user=super_user, update=update), servers)

    def list_users(self, cluster: str | None = None, servers: Sequence[str] | None = None
                   ) -> dict[str, list[dict[str, Any]]]:
        """Each master's users (access key, super-user flag), by broker address."""
        return self._on_targets("listing users", cluster, lambda b: b.acl_users(), servers)

    def delete_user(self, access_key: str, cluster: str | None = None, servers: Sequence[str] | None = None
                    ) -> dict[str, Any]:
        """Delete a user and its policy on every master; ``{"access_key", "deleted"}`` by broker address."""
        return self._on_targets(f"deleting user {access_key}", cluster, lambda b: b.acl_delete_user(access_key),
                                servers)

    def put_policy(self, subject: str, entries: Sequence[Mapping[str, Any]],
                   cluster: str | None = None, servers: Sequence[str] | None = None) -> dict[str, Any]:
        """Add policy entries for ``subject`` on every master; the whole policy by broker address."""
        return self._on_targets(f"updating the policy of {subject}", cluster,
                                lambda b: b.acl_put_policy(subject, entries), servers)

    def list_policies(self, subject: str | None = None, cluster: str | None = None,
                      servers: Sequence[str] | None = None) -> dict[str, Any]:
        """Each master's policies (or ``subject``'s), by broker address."""
        return self._on_targets("listing policies", cluster, lambda b: b.acl_policies(subject), servers)

    def delete_policy(self, subject: str, resource: str | None = None, cluster: str | None = None,
                      servers: Sequence[str] | None = None) -> dict[str, Any]:
        """Remove ``subject``'s entry for ``resource`` (all when None) on every master."""
        return self._on_targets(f"deleting the policy of {subject}", cluster,
                                lambda b: b.acl_delete_policy(subject, resource), servers)

    # -- groups --------------------------------------------------------------------------------------
    def _each_master(self, fn: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, addr in self.masters().items():
            try:
                out[name] = fn(self._brokers.http(addr))
            except SparkMQError as exc:
                log.warning("broker %s (%s) did not answer: %s", name, addr, exc)
        return out

    def group_list(self) -> list[str]:
        """Consumer groups with members on any master, sorted."""
        groups: set[str] = set()
        for found in self._each_master(lambda b: b.consumer_groups()).values():
            groups.update(found)
        return sorted(groups)

    def group_info(self, group: str) -> dict[str, dict[str, Any]]:
        """Each master's view of ``group`` (version, members, model, subscriptions), by broker name."""
        validate_group(group)
        return self._each_master(lambda b: b.consumer_group(group))

    def group_clients(self, group: str) -> list[GroupMemberData]:
        """Each member of ``group`` with its protocol and the queues it holds on every master (its last
        heartbeat's; a POP / gRPC member holds none), sorted by client id.

        Example::

            for member in admin.group_clients("orders-cg"):
                print(member.client_id, member.consume_type, member.held_queues)
        """
        return merge_group_clients(self.group_info(group))

    def group_members(self, group: str) -> list[str]:
        """Client ids of ``group`` known to any master, sorted."""
        members: set[str] = set()
        for info in self.group_info(group).values():
            members.update(info.get("members") or ())
        return sorted(members)

    def group_offsets(self, group: str, topic: str | None = None) -> dict[MessageQueue, int]:
        """The committed offsets of ``group`` (of one topic or all) over every master."""
        validate_group(group)
        out: dict[MessageQueue, int] = {}
        for name, by_topic in self._each_master(lambda b: b.group_offsets(group, topic)).items():
            for t, queues in by_topic.items():
                for queue_id, offset in queues.items():
                    out[MessageQueue(t, name, int(queue_id))] = int(offset)
        return dict(sorted(out.items()))

    def group_lag(self, group: str, topic: str | None = None) -> GroupLag:
        """How far ``group`` is behind, per queue and in total, over every master."""
        validate_group(group)
        queues: list[QueueLag] = []
        for name, answer in self._each_master(lambda b: b.group_lag(group, topic)).items():
            queues.extend(QueueLag(q["topic"], name, int(q["queue_id"]), int(q["broker_offset"]),
                                   int(q["consumer_offset"]), int(q["lag"])) for q in answer.get("queues") or ())
        queues.sort(key=lambda q: (q.topic, q.broker_name, q.queue_id))
        return GroupLag(group, sum(q.lag for q in queues), queues)

    # -- messages ------------------------------------------------------------------------------------
    def view_message(self, offset_msg_id: str) -> ReceivedMessage:
        """The message an offsetMsgId names, read from the broker whose store host it encodes.

        MESSAGE_ID_ILLEGAL when it does not decode; MESSAGE_NOT_FOUND when no broker has it.  If
        the store host is not reachable as an API address (a broker behind a proxy), every master
        is asked in turn.
        """
        decoded = decode_offset_msg_id(offset_msg_id)
        try:
            return self._brokers.http(decoded.store_host).message(offset_msg_id)
        except SparkMQError as exc:
            if exc.code is not ErrorCode.SERVICE_NOT_AVAILABLE:
                raise
            first = exc
        for addr in self.masters().values():
            if addr == decoded.store_host:
                continue
            try:
                msg = self._brokers.http(addr).message(offset_msg_id)
            except SparkMQError:
                continue
            # Another broker may read its own log at that offset: only its answer for this very id counts.
            if msg.offset_msg_id.upper() == offset_msg_id.upper():
                return msg
        raise first

    # -- message features (issue 4) ------------------------------------------------------------------
    def reset_offsets(self, group: str, topic: str, timestamp: int | None = None,
                      offsets: Mapping[MessageQueue, int] | Mapping[str, int] | None = None) -> dict[MessageQueue, int]:
        """Move ``group``'s offsets of ``topic``: to the first message stored at or after ``timestamp`` (epoch ms)
        on every queue, or to exact ``offsets`` (by :class:`MessageQueue` or ``"broker/queue_id"``).

        Running consumers of the group pick the new offsets up at once (the brokers move the group's
        version).  Returns the offsets now set.  GROUP_NOT_EXIST when no broker knows the group.
        """
        validate_group(group)
        validate_topic(topic)
        if (timestamp is None) == (offsets is None):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "give exactly one of timestamp and offsets")
        masters = self.masters()
        route = self.topic_route(topic)
        plan: dict[str, dict[int, int] | None] = {}
        if offsets is not None:
            for key, offset in offsets.items():
                mq = key if isinstance(key, MessageQueue) else _parse_queue(topic, key)
                if mq.broker_name not in masters:
                    raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"no live master named {mq.broker_name!r}")
                check_int(f"offset of {mq.key}", offset, 0)
                by_queue = plan.setdefault(mq.broker_name, {})
                assert by_queue is not None
                by_queue[mq.queue_id] = offset
        else:
            check("timestamp", timestamp, EpochMs)
            plan = {name: None for name in route.broker_names if name in masters}
        out: dict[MessageQueue, int] = {}
        missing: SparkMQError | None = None
        for name, by_queue in sorted(plan.items()):
            try:
                answer = self._brokers.http(masters[name]).reset_offsets(group, topic, timestamp=timestamp,
                                                                        offsets=by_queue)
            except SparkMQError as exc:
                if exc.code is not ErrorCode.GROUP_NOT_EXIST or offsets is not None:
                    raise
                missing = exc  # that broker never saw the group: fine while another one did
                continue
            for queue_id, offset in (answer.get("offsets") or {}).items():
                out[MessageQueue(topic, name, int(queue_id))] = int(offset)
        if not out and missing is not None:
            raise missing
        return dict(sorted(out.items()))

    def dlq_messages(self, group: str, max_messages: int = 1000) -> list[ReceivedMessage]:
        """The messages in ``%DLQ%<group>`` on every master (at most ``max_messages``), each with its
        original topic (``DLQ_ORIGIN_TOPIC``), id (``ORIGIN_MESSAGE_ID``) and reason (``DLQ_REASON``)."""
        validate_group(group)
        out: list[ReceivedMessage] = []
        for addr in self.masters().values():
            offset = 0
            while len(out) < max_messages:
                try:
                    answer = self._brokers.http(addr).dlq_messages(group, offset, min(32, max_messages - len(out)))
                except SparkMQError as exc:
                    if exc.code in (ErrorCode.TOPIC_NOT_EXIST, ErrorCode.GROUP_NOT_EXIST):
                        break  # no dead letters of that group on this broker
                    raise
                messages = answer.get("messages") or []
                out.extend(messages)
                next_offset = int(answer.get("next_offset", offset))
                if not messages or next_offset <= offset:
                    break
                offset = next_offset
        return out[:max_messages]

    def redrive(self, group: str, msg_ids: Sequence[str] | None = None, all: bool = False,  # noqa: A002
                topic: str | None = None, tags: str | None = None) -> dict[str, Any]:
        """Send dead letters of ``group`` back to their original topics: the ones with ``msg_ids``, or ``all``
        (optionally only of ``topic`` / with ``tags``).  ``{"redriven": n, "results": [send results]}``."""
        validate_group(group)
        if not msg_ids and not all:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "give msg_ids or all=True")
        total = 0
        results: list[dict[str, Any]] = []
        errors: list[SparkMQError] = []
        for addr in self.masters().values():
            try:
                answer = self._brokers.http(addr).redrive(group, msg_ids=msg_ids, all_messages=all, topic=topic,
                                                         tags=tags)
            except SparkMQError as exc:
                if exc.code is ErrorCode.SERVICE_NOT_AVAILABLE:
                    raise
                errors.append(exc)  # e.g. no DLQ of the group on that broker
                continue
            total += int(answer.get("redriven") or 0)
            results.extend(answer.get("results") or [])
        if not total and errors and len(errors) == len(self.masters()):
            raise errors[0]
        return {"redriven": total, "results": results}

    def resend(self, msg_id: str, group: str) -> dict[str, Any]:
        """Have ``group`` consume one message again: a copy (reconsume count 0) goes to ``%RETRY%<group>`` on the
        master holding it, so no other group sees it (RocketMQ dashboard's re-send).

        ``msg_id``: an offsetMsgId, or a msgId (UNIQ_KEY) the masters' lake index knows.  Answers the first
        master that had it: ``{"group", "msg_id", "origin_topic", "result"}``.  Errors, nothing stored:
        MESSAGE_ID_ILLEGAL, MESSAGE_NOT_FOUND (no master has it), GROUP_ILLEGAL, GROUP_NOT_EXIST (unknown
        where the message is).

        Example::

            admin.resend(sent.offset_msg_id, "billing-cg")
        """
        if not isinstance(msg_id, str) or not msg_id.strip():
            raise SparkMQError(ErrorCode.MESSAGE_ID_ILLEGAL, "a message id is needed")
        validate_group(group)
        masters = sorted(self.masters().values())
        if not masters:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, "no live master to re-send on")
        refused: SparkMQError | None = None
        not_found: SparkMQError | None = None
        for addr in masters:
            try:
                return self._brokers.http(addr).resend(group, msg_id.strip())
            except SparkMQError as exc:
                # Only the master holding the message can copy it: a plain "not here" from the others is no
                # answer while one of them said why it refused (an unknown group, no permission).
                if exc.code is ErrorCode.MESSAGE_NOT_FOUND:
                    not_found = not_found or exc
                else:
                    refused = refused or exc
        error = refused or not_found
        assert error is not None
        raise error

    def recall_timer(self, msg_id: str) -> dict[str, Any]:
        """Recall a pending timer message on whichever master holds it: ``{"msg_id", "recalled"}``."""
        if not isinstance(msg_id, str) or not msg_id.strip():
            raise SparkMQError(ErrorCode.MESSAGE_ID_ILLEGAL, "a message id is needed")
        for addr in self.masters().values():
            answer = self._brokers.http(addr).recall_timer(msg_id)
            if answer.get("recalled"):
                return dict(answer)
        return {"msg_id": msg_id, "recalled": False}


def merge_group_clients(views: Mapping[str, Mapping[str, Any]]) -> list[GroupMemberData]:
    """The members of one group over several brokers' views (``group_info``'s answer: broker name -> ``GET
    /consumers/{group}``): each member once, with the queues it holds on any of them, sorted by client id."""
    merged: dict[str, GroupMemberData] = {}
    for view in views.values():
        for c in view.get("clients") or ():
            seen = merged.get(c["client_id"])
            held = sorted(set(c.get("held_queues") or ()) | set(seen.held_queues if seen else ()))
            merged[c["client_id"]] = GroupMemberData(
                c["client_id"], (seen and seen.consume_type) or c.get("consume_type"),
                (seen and seen.message_model) or c.get("message_model"), held)
    return [merged[k] for k in sorted(merged)]


def _parse_queue(topic: str, text: str) -> MessageQueue:
    """``"broker-a/3"`` -> ``MessageQueue(topic, "broker-a", 3)``; INVALID_ARGUMENT otherwise."""
    broker, sep, queue = str(text).rpartition("/")
    if not sep or not broker or not queue.isdigit():
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"a queue is 'broker/queue_id', got {text!r}")
    return MessageQueue(topic, broker, int(queue))
