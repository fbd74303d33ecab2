"""``sparkmq admin …``, ``sparkmq produce`` and ``sparkmq consume``: the platform from a shell.

Every command talks to the name servers given by ``--namesrv`` (or ``SPARKMQ_NAMESRV``,
default ``127.0.0.1:9876``) through the Python client.  Tables for people; ``--json``
prints JSON for scripts.  A stable error prints ``CODE: message`` and exits 1.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ...platform.auth import Credentials
from ...platform.client.admin import AdminClient
from ...platform.client.config import ClientConfig
from ...platform.client.producer import Producer
from ...platform.client.pull_consumer import PullConsumer
from ...platform.common.errors import SparkMQError
from ...platform.common.message import Message
from ...platform.common.system_topics import PROPERTY_DLQ_ORIGIN_TOPIC, PROPERTY_DLQ_REASON, PROPERTY_ORIGIN_MSG_ID
from ...platform.common.wire import ReceivedMessage
from .credentials import credential_options, credentials_of
from .output import console, emit, emit_rows, fail

__all__ = ["admin", "produce", "consume"]

F = TypeVar("F", bound=Callable[..., Any])

namesrv_option = click.option("--namesrv", envvar="SPARKMQ_NAMESRV", default="127.0.0.1:9876", show_default=True,
                              help='name servers, "host:port;host:port" (env SPARKMQ_NAMESRV)')
json_option = click.option("--json", "as_json", is_flag=True, help="print JSON")


def _client_config(namesrv: str, credentials: Credentials | None) -> ClientConfig:
    # Services with ACL on want signed requests (--access-key / --secret-key or their environment variables).
    keys: dict[str, Any] = {} if credentials is None else {
        "access_key": credentials.access_key, "secret_key": credentials.secret_key}
    return ClientConfig(namesrv_addrs=namesrv, **keys)


def stable_errors(fn: F) -> F:
    """Turn a SparkMQError into ``CODE: message`` and exit status 1 (JSON with --json)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SparkMQError as exc:
            obj = click.get_current_context().obj or {}
            fail(exc, bool(kwargs.get("as_json") or obj.get("json")))
    return wrapper  # type: ignore[return-value]


def _admin(ctx: click.Context) -> AdminClient:
    admin = AdminClient(_client_config(ctx.obj["namesrv"], ctx.obj["credentials"]))
    ctx.call_on_close(admin.close)
    return admin


@click.group()
@namesrv_option
@credential_options
@json_option
@click.pass_context
def admin(ctx: click.Context, namesrv: str, access_key: str | None, secret_key: str | None, as_json: bool) -> None:
    """Topics, groups, offsets, messages and the cluster."""
    ctx.obj = {"namesrv": namesrv, "json": as_json, "credentials": credentials_of(access_key, secret_key)}


# -- topics -------------------------------------------------------------------------------

@admin.group()
def topic() -> None:
    """Create, update, list, route, stats, delete."""


def _topic_options(fn: F) -> F:
    for option in reversed([
        click.option("--read-queues", type=int, default=16, show_default=True),
        click.option("--write-queues", type=int, default=16, show_default=True),
        click.option("--perm", type=int, default=6, show_default=True,
                     help="6 rw, 4 write-forbidden, 2 read-forbidden"),
        click.option("--order", is_flag=True, help="an ordered topic"),
        click.option("--cluster", default=None, help="only this cluster's masters"),
        click.option("--broker", "brokers", multiple=True, help="only these broker addresses (repeatable)"),
    ]):
        fn = option(fn)
    return fn


def _write_topic(ctx: click.Context, name: str, read_queues: int, write_queues: int, perm: int, order: bool,
                 cluster: str | None, brokers: tuple[str, ...], update: bool) -> None:
    client = _admin(ctx)
    call = client.update_topic if update else client.create_topic
    result = call(name, read_queue_nums=read_queues, write_queue_nums=write_queues, perm=perm, order=order,
                  cluster=cluster, broker_addrs=list(brokers) or None)
    rows = [{"broker": addr, **cfg} for addr, cfg in sorted(result.items())]
    emit_rows(rows, ["broker", "topic", "read_queue_nums", "write_queue_nums", "perm", "order"], ctx.obj["json"],
              title=f"topic {name}")


@topic.command("create")
@click.argument("name")
@_topic_options
@click.pass_context
@stable_errors
def topic_create(ctx: click.Context, name: str, **kwargs: Any) -> None:
    """Create a topic on every master (or the given brokers)."""
    _write_topic(ctx, name, update=False, **kwargs)


@topic.command("update")
@click.argument("name")
@_topic_options
@click.pass_context
@stable_errors
def topic_update(ctx: click.Context, name: str, **kwargs: Any) -> None:
    """Change a topic's queue counts, perm or order flag."""
    _write_topic(ctx, name, update=True, **kwargs)


@topic.command("list")
@click.pass_context
@stable_errors
def topic_list(ctx: click.Context) -> None:
    """Every topic some live broker serves."""
    topics = _admin(ctx).topic_list()
    emit_rows([{"topic": t} for t in topics], ["topic"], ctx.obj["json"])


@topic.command("route")
@click.argument("name")
@click.pass_context
@stable_errors
def topic_route(ctx: click.Context, name: str) -> None:
    """Which brokers serve a topic, with their queue counts and perm."""
    route = _admin(ctx).topic_route(name)
    rows = [{"broker": q.broker_name, "addr": route.master_addr(q.broker_name), "read_queue_nums": q.read_queue_nums,
             "write_queue_nums": q.write_queue_nums, "perm": q.perm} for q in route.queue_datas]
    emit_rows(rows, ["broker", "addr", "read_queue_nums", "write_queue_nums", "perm"], ctx.obj["json"],
              title=f"route of {name}")


@topic.command("stats")
@click.argument("name")
@click.pass_context
@stable_errors
def topic_stats(ctx: click.Context, name: str) -> None:
    """Min and max offset of every queue of a topic."""
    rows = [dataclasses.asdict(s) for s in _admin(ctx).topic_stats(name)]
    emit_rows(rows, ["broker_name", "queue_id", "min_offset", "max_offset", "last_store_timestamp"],
              ctx.obj["json"], title=f"stats of {name}")


@topic.command("delete")
@click.argument("name")
@click.option("--cluster", default=None)
@click.pass_context
@stable_errors
def topic_delete(ctx: click.Context, name: str, cluster: str | None) -> None:
    """Delete a topic from the brokers and the name servers."""
    emit(_admin(ctx).delete_topic(name, cluster=cluster), ctx.obj["json"])


# -- users and ACLs (docs/security.md) ---------------------------------------------------------

#: Where the user/acl commands apply: every master (default), or the services named (a name server's or a
#: gateway's own ACL, docs/security.md).
server_option = click.option("--server", "servers", multiple=True, metavar="HOST:PORT",
                             help="manage this service's own ACL (a name server, a gateway) instead of every "
                                  "master's (repeat for several)")


@admin.group()
def user() -> None:
    """Create, list, delete ACL users (super users only while ACL is on: sign with admin --access-key/--secret-key)."""


@user.command("create")
@click.argument("access_key")
@click.option("--secret", prompt=True, hide_input=True, envvar="SPARKMQ_NEW_USER_SECRET",
              help="the new user's secret key (prompted for, or env SPARKMQ_NEW_USER_SECRET; never printed)")
@click.option("--super-user", is_flag=True, help="the user may do anything, ACL administration included")
@click.option("--update", is_flag=True, help="change an existing user's secret and flag")
@click.option("--cluster", default=None, help="only the masters of this cluster (default: all)")
@server_option
@click.pass_context
@stable_errors
def user_create(ctx: click.Context, access_key: str, secret: str, super_user: bool, update: bool,
                cluster: str | None, servers: tuple[str, ...]) -> None:
    """Create a user on every master broker (or on the --server services)."""
    answers = _admin(ctx).create_user(access_key, secret, super_user=super_user, update=update, cluster=cluster,
                                      servers=servers)
    emit_rows([{"broker": addr, **u} for addr, u in answers.items()], ["broker", "access_key", "super_user"],
              ctx.obj["json"], title=f"user {access_key}")


@user.command("list")
@click.option("--cluster", default=None)
@server_option
@click.pass_context
@stable_errors
def user_list(ctx: click.Context, cluster: str | None, servers: tuple[str, ...]) -> None:
    """Every user of every master (secrets are never shown)."""
    rows = [{"broker": addr, **u} for addr, users in _admin(ctx).list_users(cluster, servers).items() for u in users]
    emit_rows(rows, ["broker", "access_key", "super_user"], ctx.obj["json"], title="users")


@user.command("delete")
@click.argument("access_key")
@click.option("--cluster", default=None)
@server_option
@click.pass_context
@stable_errors
def user_delete(ctx: click.Context, access_key: str, cluster: str | None, servers: tuple[str, ...]) -> None:
    """Delete a user and its policy on every master."""
    answers = _admin(ctx).delete_user(access_key, cluster, servers)
    emit_rows([{"broker": addr, **a} for addr, a in answers.items()], ["broker", "access_key", "deleted"],
              ctx.obj["json"])


@admin.group()
def acl() -> None:
    """Create, list, delete policy entries: allow/deny actions on resources from addresses."""


def _acl_rows(answers: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for addr, policies in answers.items():
        for policy in policies if isinstance(policies, list) else [policies]:
            for e in policy.get("entries") or ():
                rows.append({"broker": addr, "subject": policy["subject"], "resource": e["resource"],
                             "actions": ",".join(e["actions"]), "decision": e["decision"],
                             "source_ips": ",".join(e["source_ips"]) or "*"})
    return rows


_ACL_COLUMNS = ["broker", "subject", "resource", "actions", "decision", "source_ips"]


@acl.command("create")
@click.argument("subject")
@click.option("--resource", required=True, help="'*', 'Cluster', 'Topic:<name>', 'Group:<name>'; final '*' = prefix")
@click.option("--actions", required=True, help="Pub,Sub,Create,Update,Delete,Get,List (or All, Admin)")
@click.option("--decision", type=click.Choice(["Allow", "Deny"], case_sensitive=False), default="Allow",
              show_default=True)
@click.option("--source-ip", "source_ips", multiple=True, help="a CIDR the entry applies from (repeat; default any)")
@click.option("--cluster", default=None)
@server_option
@click.pass_context
@stable_errors
def acl_create(ctx: click.Context, subject: str, resource: str, actions: str, decision: str,
               source_ips: tuple[str, ...], cluster: str | None, servers: tuple[str, ...]) -> None:
    """Add (or replace, for the same resource) one entry of a user's policy on every master."""
    entry = {"resource": resource, "actions": [a.strip() for a in actions.split(",") if a.strip()],
             "decision": decision.capitalize(), "source_ips": list(source_ips)}
    emit_rows(_acl_rows(_admin(ctx).put_policy(subject, [entry], cluster, servers)), _ACL_COLUMNS, ctx.obj["json"],
              title=f"policy of {subject}")


@acl.command("list")
@click.argument("subject", required=False)
@click.option("--cluster", default=None)
@server_option
@click.pass_context
@stable_errors
def acl_list(ctx: click.Context, subject: str | None, cluster: str | None, servers: tuple[str, ...]) -> None:
    """Every policy entry (or one user's) of every master."""
    emit_rows(_acl_rows(_admin(ctx).list_policies(subject, cluster, servers)), _ACL_COLUMNS, ctx.obj["json"],
              title="policies")


@acl.command("delete")
@click.argument("subject")
@click.option("--resource", default=None, help="only this resource's entry (default: every entry)")
@click.option("--cluster", default=None)
@server_option
@click.pass_context
@stable_errors
def acl_delete(ctx: click.Context, subject: str, resource: str | None, cluster: str | None,
               servers: tuple[str, ...]) -> None:
    """Remove a user's entry for a resource, or all its entries, on every master."""
    answers = _admin(ctx).delete_policy(subject, resource, cluster, servers)
    emit_rows([{"broker": addr, **a} for addr, a in answers.items()], ["broker", "subject", "removed"],
              ctx.obj["json"])


# -- groups -------------------------------------------------------------------------------

@admin.group()
def group() -> None:
    """List groups; members, offsets and lag of one."""


@group.command("list")
@click.pass_context
@stable_errors
def group_list(ctx: click.Context) -> None:
    """Every consumer group some broker knows."""
    emit_rows([{"group": g} for g in _admin(ctx).group_list()], ["group"], ctx.obj["json"])


@group.command("members")
@click.argument("name")
@click.pass_context
@stable_errors
def group_members(ctx: click.Context, name: str) -> None:
    """The client ids in a group."""
    emit_rows([{"client_id": m} for m in _admin(ctx).group_members(name)], ["client_id"], ctx.obj["json"],
              title=f"members of {name}")


@group.command("offsets")
@click.argument("name")
@click.option("--topic", "topic_name", default=None)
@click.pass_context
@stable_errors
def group_offsets(ctx: click.Context, name: str, topic_name: str | None) -> None:
    """A group's committed offsets per queue."""
    rows = [{"topic": mq.topic, "broker": mq.broker_name, "queue_id": mq.queue_id, "offset": off}
            for mq, off in _admin(ctx).group_offsets(name, topic_name).items()]
    emit_rows(rows, ["topic", "broker", "queue_id", "offset"], ctx.obj["json"], title=f"offsets of {name}")


@group.command("lag")
@click.argument("name")
@click.option("--topic", "topic_name", default=None)
@click.pass_context
@stable_errors
def group_lag(ctx: click.Context, name: str, topic_name: str | None) -> None:
    """How far a group is behind, per queue and in total."""
    lag = _admin(ctx).group_lag(name, topic_name)
    if ctx.obj["json"]:
        emit(dataclasses.asdict(lag), True)
        return
    emit_rows([dataclasses.asdict(q) for q in lag.queues],
              ["topic", "broker_name", "queue_id", "broker_offset", "consumer_offset", "lag"], False,
              title=f"lag of {name}: {lag.total_lag}")


# -- cluster and messages -----------------------------------------------------------------

@admin.group()
def cluster() -> None:
    """The clusters and their brokers."""


@cluster.command("list")
@click.pass_context
@stable_errors
def cluster_list(ctx: click.Context) -> None:
    """Every cluster, broker name and address the name servers know."""
    info = _admin(ctx).cluster_list()
    if ctx.obj["json"]:
        emit(info, True)
        return
    rows = []
    for cluster_name, names in sorted(info.get("clusters", {}).items()):
        for broker_name in sorted(names):
            addrs = info.get("brokers", {}).get(broker_name, {}).get("broker_addrs", {})
            for broker_id, addr in sorted(addrs.items()):
                rows.append({"cluster": cluster_name, "broker": broker_name, "id": broker_id, "addr": addr,
                             **_replication_columns(_admin(ctx), addr), **_disk_columns(_admin(ctx), addr)})
    emit_rows(rows, ["cluster", "broker", "id", "addr", "role", "in_sync", "bytes_behind", "disk", "writes"], False,
              title="cluster")


def _disk_columns(admin_client: Any, addr: str) -> dict[str, Any]:
    """The store's disk of one broker (its ``GET /broker``): the share used with its watermark state, and whether
    sends are accepted or refused (DISK_FULL)."""
    try:
        disk = admin_client.broker_info(addr).get("disk") or {}
    except SparkMQError:
        return {"disk": "", "writes": ""}
    if "used_ratio" not in disk:
        return {"disk": disk.get("error", ""), "writes": ""}
    return {"disk": f"{disk['used_ratio']:.0%} {disk.get('state', '')}".strip(),
            "writes": "accepted" if disk.get("writable", True) else "refused (DISK_FULL)"}


def _replication_columns(admin_client: Any, addr: str) -> dict[str, Any]:
    """Role and replication state of one broker: a master's in-sync slaves and largest lag, a slave's lag."""
    try:
        ha = admin_client.replication(addr)
    except SparkMQError:
        return {"role": "unreachable", "in_sync": "", "bytes_behind": ""}
    if ha.get("role") == "SLAVE":
        return {"role": "SLAVE", "in_sync": "connected" if ha.get("connected") else "disconnected",
                "bytes_behind": ha.get("bytes_behind")}
    if "term" in ha:  # a DLedger member: its Raft role and term
        return _dledger_columns(ha)
    slaves = ha.get("slaves")
    return {"role": ha.get("role"), "in_sync": "" if slaves is None else f"{ha.get('in_sync_slaves', 0)}/{len(slaves)}",
            "bytes_behind": ha.get("max_bytes_behind")}


def _dledger_columns(status: dict[str, Any]) -> dict[str, Any]:
    """A DLedger member in the cluster table: role and term; a leader's peers caught up to its commit offset and
    the largest gap, a follower's leader."""
    role = f"{status.get('role')} ({status.get('self_id')}, term {status.get('term')})"
    peers = status.get("peers") or {}
    if status.get("role") == "LEADER":
        commit, end = status.get("commit_offset", 0), status.get("log_end", 0)
        caught_up = sum(1 for p in peers.values() if p.get("match_offset", 0) >= commit)
        behind = max((end - p.get("match_offset", 0) for p in peers.values()), default=0)
        return {"role": role, "in_sync": f"{caught_up}/{len(peers)}", "bytes_behind": behind}
    return {"role": role, "in_sync": f"follows {status.get('leader') or 'nobody'}", "bytes_behind": ""}


# -- DLedger --------------------------------------------------------------------------------

broker_option = click.option("--broker", "broker_addr", required=True, metavar="ADDR",
                             help="the broker's HTTP address host:port (a member of the group)")


@admin.group()
def dledger() -> None:
    """A broker's DLedger group: its members' state, leadership transfer."""


@dledger.command("status")
@broker_option
@click.pass_context
@stable_errors
def dledger_status(ctx: click.Context, broker_addr: str) -> None:
    """The DLedger member at ADDR: role, term, leader, commit offset (and a leader's view of each peer)."""
    status = _admin(ctx).dledger_status(broker_addr)
    if ctx.obj["json"]:
        emit(status, True)
        return
    keys = ["group", "self_id", "role", "term", "leader", "master_addr", "commit_offset", "log_end",
            "visible_offset", "waiting_sends", "transfer_target"]
    emit_rows([{"key": k, "value": status.get(k)} for k in keys]
              + [{"key": f"member {m}", "value": a} for m, a in (status.get("members") or {}).items()],
              ["key", "value"], False, title=f"DLedger member at {broker_addr}")
    peers = status.get("peers") or {}
    if peers:
        emit_rows([{"peer": p, **progress} for p, progress in sorted(peers.items())],
                  ["peer", "match_offset", "next_offset", "failures", "last_ack_age_s"], False,
                  title="replication to each peer")


@dledger.command("transfer")
@broker_option
@click.option("--to", "to_id", required=True, metavar="ID", help="the member id to hand the leadership to (n1)")
@click.pass_context
@stable_errors
def dledger_transfer(ctx: click.Context, broker_addr: str, to_id: str) -> None:
    """Hand the leadership of the group led by ADDR to member ID; returns once ID leads."""
    result = _admin(ctx).transfer_leadership(broker_addr, to_id)
    emit(result, ctx.obj["json"], render=lambda r: console.print(
        f"{r['leader']} leads DLedger group {r['group']} in term {r['term']} (was {r['from']}, term "
        f"{r['previous_term']})"))


@admin.group("lake")
def lake_group() -> None:
    """The brokers' lake jobs."""


@lake_group.command("status")
@click.option("--cluster", default=None)
@click.pass_context
@stable_errors
def lake_status(ctx: click.Context, cluster: str | None) -> None:
    """Each broker's lake: state, and per job its state, last batch, rows, restarts and last error."""
    status = _admin(ctx).lake_status(cluster)
    if ctx.obj["json"]:
        emit(status, True)
        return
    rows = []
    for broker_name, lake in status.items():
        jobs = lake.get("jobs") or {"-": {}}
        for job_name, job in jobs.items():
            rows.append({"broker": broker_name, "lake": lake.get("state"), "job": job_name,
                         "state": job.get("state"), "last_batch": job.get("last_batch_id"),
                         "rows": job.get("rows_total", job.get("last_batch_rows")),
                         "restarts": job.get("restarts"), "last_error": job.get("last_error")})
    emit_rows(rows, ["broker", "lake", "job", "state", "last_batch", "rows", "restarts", "last_error"], False,
              title="lake")


@admin.group()
def msg() -> None:
    """Look at messages."""


@msg.command("view")
@click.argument("offset_msg_id")
@click.pass_context
@stable_errors
def msg_view(ctx: click.Context, offset_msg_id: str) -> None:
    """A message by its offsetMsgId (it decodes to the broker and the commit-log offset)."""
    emit(_message_row(_admin(ctx).view_message(offset_msg_id)), ctx.obj["json"])


@msg.command("query")
@click.option("--topic", "topic_name", default=None)
@click.option("--key", default=None, help="one of the message's KEYS (with --topic)")
@click.option("--msg-id", default=None, help="the producer's unique message id")
@click.option("--begin", "begin_ms", type=int, default=None, help="store time from, epoch ms (with --topic, --end)")
@click.option("--end", "end_ms", type=int, default=None, help="store time until (exclusive), epoch ms")
@click.option("--max", "max_hits", type=int, default=32, show_default=True, help="at most this many (64)")
@click.pass_context
@stable_errors
def msg_query(ctx: click.Context, topic_name: str | None, key: str | None, msg_id: str | None,
              begin_ms: int | None, end_ms: int | None, max_hits: int) -> None:
    """Find messages through the lake's index: by key, by msg id, or by topic and store-time range."""
    found = _admin(ctx).query_messages(topic=topic_name, key=key, msg_id=msg_id, begin_ms=begin_ms, end_ms=end_ms,
                                       max_hits=max_hits)
    rows = [_message_row(m) for m in found]
    emit_rows(rows, ["topic", "broker", "queue_id", "queue_offset", "msg_id", "keys", "store_timestamp", "body"],
              ctx.obj["json"], title="messages found")


@msg.command("resend")
@click.argument("msg_id")
@click.option("--group", "group_name", required=True, help="the consumer group that consumes it again (only it)")
@click.pass_context
@stable_errors
def msg_resend(ctx: click.Context, msg_id: str, group_name: str) -> None:
    """Have one group consume a message again (an offsetMsgId, or a msgId the lake's index knows): a copy goes to
    %RETRY%<group> with reconsume count 0."""
    result = _admin(ctx).resend(msg_id, group_name)
    emit({"group": result["group"], "msg_id": result["msg_id"], "origin_topic": result["origin_topic"],
          **{k: result["result"].get(k) for k in ("topic", "queue_id", "queue_offset", "offset_msg_id")}},
         ctx.obj["json"])


def _message_row(m: ReceivedMessage) -> dict[str, Any]:
    return {"topic": m.topic, "broker": m.broker_name, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
            "msg_id": m.msg_id, "offset_msg_id": m.offset_msg_id, "tags": m.tags, "keys": list(m.keys),
            "properties": m.user_properties, "born_timestamp": m.born_timestamp,
            "store_timestamp": m.store_timestamp, "reconsume_times": m.reconsume_times,
            "body": m.body.decode("utf-8", "replace")}


# -- dead letters, offset reset, timers ------------------------------------------------------

@admin.group()
def dlq() -> None:
    """List and re-drive a group's dead letters (%DLQ%<group>)."""


@dlq.command("list")
@click.argument("group_name", metavar="GROUP")
@click.option("--max", "max_messages", type=int, default=1000, show_default=True)
@click.pass_context
@stable_errors
def dlq_list(ctx: click.Context, group_name: str, max_messages: int) -> None:
    """The dead letters of GROUP with their original topic, id and last failure reason."""
    rows = []
    for m in _admin(ctx).dlq_messages(group_name, max_messages):
        row = _message_row(m)
        row.update(origin_topic=m.properties.get(PROPERTY_DLQ_ORIGIN_TOPIC),
                   origin_msg_id=m.properties.get(PROPERTY_ORIGIN_MSG_ID),
                   reason=m.properties.get(PROPERTY_DLQ_REASON))
        rows.append(row)
    emit_rows(rows, ["queue_offset", "msg_id", "origin_topic", "reconsume_times", "reason", "body"], ctx.obj["json"],
              title=f"dead letters of {group_name}")


@dlq.command("redrive")
@click.argument("group_name", metavar="GROUP")
@click.option("--msg-id", "msg_ids", multiple=True, help="a dead letter to send back (repeatable)")
@click.option("--all", "all_messages", is_flag=True, help="every dead letter of the group")
@click.option("--topic", "topic_name", default=None, help="with --all: only those of this original topic")
@click.pass_context
@stable_errors
def dlq_redrive(ctx: click.Context, group_name: str, msg_ids: tuple[str, ...], all_messages: bool,
                topic_name: str | None) -> None:
    """Send dead letters of GROUP back to their original topics (the DLQ keeps its copy)."""
    if bool(msg_ids) == all_messages:
        raise click.UsageError("give --msg-id ... or --all")
    result = _admin(ctx).redrive(group_name, msg_ids=list(msg_ids) or None, all=all_messages, topic=topic_name)
    if ctx.obj["json"]:
        emit(result, True)
        return
    emit_rows(result["results"], ["status", "msg_id", "topic", "broker_name", "queue_id", "queue_offset"], False,
              title=f"re-drove {result['redriven']} message(s) of {group_name}")


@admin.group()
def offset() -> None:
    """Reset a group's consumer offsets."""


@offset.command("reset")
@click.argument("group_name", metavar="GROUP")
@click.argument("topic_name", metavar="TOPIC")
@click.option("--timestamp", type=int, default=None, help="epoch ms: every queue to its first message at or after it")
@click.option("--to-offset", "to_offsets", multiple=True, metavar="BROKER/QUEUE=OFFSET",
              help="one queue to an exact offset (repeatable)")
@click.pass_context
@stable_errors
def offset_reset(ctx: click.Context, group_name: str, topic_name: str, timestamp: int | None,
                 to_offsets: tuple[str, ...]) -> None:
    """Move GROUP's offsets of TOPIC by time or to exact offsets; running consumers follow at once."""
    if (timestamp is None) == (not to_offsets):
        raise click.UsageError("give --timestamp or --to-offset (not both)")
    offsets: dict[str, int] | None = None
    if to_offsets:
        offsets = {}
        for item in to_offsets:
            queue, sep, value = item.partition("=")
            if not sep or not value.strip().isdigit():
                raise click.BadParameter(f"{item!r} is not broker/queue=offset", param_hint="--to-offset")
            offsets[queue.strip()] = int(value)
    result = _admin(ctx).reset_offsets(group_name, topic_name, timestamp=timestamp, offsets=offsets)
    rows = [{"topic": mq.topic, "broker": mq.broker_name, "queue_id": mq.queue_id, "offset": off}
            for mq, off in result.items()]
    emit_rows(rows, ["topic", "broker", "queue_id", "offset"], ctx.obj["json"],
              title=f"offsets of {group_name} on {topic_name}")


@admin.group()
def timer() -> None:
    """Timer messages."""


@timer.command("recall")
@click.argument("msg_id")
@click.pass_context
@stable_errors
def timer_recall(ctx: click.Context, msg_id: str) -> None:
    """Recall a pending timer message by its message id (it will never be delivered)."""
    emit(_admin(ctx).recall_timer(msg_id), ctx.obj["json"])


# -- message trace -------------------------------------------------------------------------

_TRACE_COLUMNS = ["step", "status", "time", "+ms", "total_ms", "topic", "group", "client_id", "broker", "queue",
                  "offset", "reconsume", "cost_ms", "detail"]


def _trace_row(event: dict[str, Any]) -> dict[str, Any]:
    ts = datetime.datetime.fromtimestamp(event["event_ts"] / 1000, tz=datetime.UTC)
    return {"step": event["event_type"], "status": event["status"], "time": ts.strftime("%H:%M:%S.%f")[:-3],
            "+ms": event["elapsed_ms"], "total_ms": event["since_first_ms"], "topic": event["topic"],
            "group": event.get("group"), "client_id": event.get("client_id"), "broker": event.get("broker"),
            "queue": event.get("queue_id"), "offset": event.get("queue_offset"),
            "reconsume": event.get("reconsume_times"), "cost_ms": event.get("cost_ms"), "detail": event.get("detail")}


@admin.command("trace")
@click.argument("msg_id", metavar="MSG_ID")
@click.option("--cluster", default=None, help="only this cluster's masters")
@json_option
@click.pass_context
@stable_errors
def trace(ctx: click.Context, msg_id: str, cluster: str | None, as_json: bool) -> None:
    """A message's path (send, store, deliver, consume, retries, DLQ) with the time between steps.

    Read from the lakes' message_trace tables, so a message shows up once the trace job ran.
    --json prints the events as a list (times as epoch ms, elapsed_ms, since_first_ms).
    """
    events = _admin(ctx).trace(msg_id, cluster)
    if as_json or ctx.obj["json"]:
        click.echo(json.dumps(events, default=str))
        return
    if not events:
        console.print(f"no trace events for {msg_id} (yet: the trace job writes them within seconds)")
        return
    emit_rows([_trace_row(e) for e in events], _TRACE_COLUMNS, False, title=f"trace of {msg_id}")


# -- produce and consume ------------------------------------------------------------------

@click.command()
@click.argument("topic_name", metavar="TOPIC")
@namesrv_option
@click.option("--body", default=None, help="the body; without it every line of stdin is one message")
@click.option("--tags", default=None)
@click.option("--keys", default=None, help="space-separated keys")
@click.option("--property", "properties", multiple=True, help="key=value (repeatable)")
@click.option("--sharding-key", default=None, help="send in order to the queue this key maps to")
@click.option("--group", default="SPARKMQ_CLI_PRODUCER", show_default=True)
@click.option("--delay-level", type=int, default=None, help="deliver after delay level N (1 = 1s ... 18 = 2h)")
@click.option("--deliver-at-ms", type=int, default=None, help="a timer message: deliver at this epoch ms")
@credential_options
@json_option
@stable_errors
def produce(topic_name: str, namesrv: str, body: str | None, tags: str | None, keys: str | None,
            properties: tuple[str, ...], sharding_key: str | None, group: str, delay_level: int | None,
            deliver_at_ms: int | None, access_key: str | None, secret_key: str | None, as_json: bool) -> None:
    """Send messages to TOPIC (one per stdin line, or --body) and print where each was stored.

    With --delay-level or --deliver-at-ms the place printed is the parked copy's.
    """
    props = {}
    for item in properties:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not key=value", param_hint="--property")
        props[key] = value
    bodies = [body] if body is not None else [line.rstrip("\n") for line in sys.stdin if line.strip()]
    rows = []
    with Producer(group, _client_config(namesrv, credentials_of(access_key, secret_key))) as producer:
        for text in bodies:
            message = Message(topic_name, text.encode("utf-8"), tags=tags, keys=tuple((keys or "").split()),
                              properties=dict(props))
            result = producer.send(message, sharding_key=sharding_key, delay_level=delay_level,
                                   deliver_at_ms=deliver_at_ms)
            rows.append({"status": str(result.status), "msg_id": result.msg_id,
                         "offset_msg_id": result.offset_msg_id, "broker": result.broker_name,
                         "queue_id": result.queue_id, "queue_offset": result.queue_offset})
    emit_rows(rows, ["status", "msg_id", "broker", "queue_id", "queue_offset"], as_json, title=f"sent to {topic_name}")


@click.command()
@click.argument("topic_name", metavar="TOPIC")
@namesrv_option
@click.option("--group", default="SPARKMQ_CLI_CONSUMER", show_default=True)
@click.option("--expression", default="*", show_default=True, help="tag expression: * or 'A || B'")
@click.option("--sql", default=None, help="an SQL92 filter over message properties instead of --expression")
@click.option("--from", "from_where", type=click.Choice(["first", "last"]), default="first", show_default=True,
              help="where a group with no committed offset starts")
@click.option("--count", type=int, default=None, help="stop after this many messages")
@click.option("--timeout", "timeout_s", type=float, default=10.0, show_default=True,
              help="stop after this many seconds without a message")
@credential_options
@json_option
@stable_errors
def consume(topic_name: str, namesrv: str, group: str, expression: str, sql: str | None, from_where: str,
            count: int | None, timeout_s: float, access_key: str | None, secret_key: str | None,
            as_json: bool) -> None:
    """Receive messages of TOPIC as GROUP and print them (JSON lines with --json); commits as it goes."""
    start = "CONSUME_FROM_FIRST_OFFSET" if from_where == "first" else "CONSUME_FROM_LAST_OFFSET"
    consumer = PullConsumer(group, _client_config(namesrv, credentials_of(access_key, secret_key)),
                            consume_from_where=start)
    if sql is not None:
        consumer.subscribe(topic_name, sql, filter_type="SQL92")
    else:
        consumer.subscribe(topic_name, expression)
    consumer.start()
    received = 0
    idle_since = time.monotonic()
    try:
        while (count is None or received < count) and time.monotonic() - idle_since < timeout_s:
            batch = consumer.poll(min(1.0, timeout_s))
            if batch:
                idle_since = time.monotonic()
            for message in batch[: None if count is None else count - received]:
                row = _message_row(message)
                if as_json:
                    click.echo(json.dumps(row))
                else:
                    console.print(f"[bold]{row['broker']}/{row['queue_id']}@{row['queue_offset']}[/] "
                                  f"{row['msg_id']} tags={row['tags']} keys={row['keys']}: {row['body']}")
                received += 1
        consumer.commit()
    finally:
        consumer.shutdown()
    if not as_json:
        console.print(f"received {received} message(s)")
