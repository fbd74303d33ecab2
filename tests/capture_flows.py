#!/usr/bin/env python3
"""Capture what RocketMQ's own clients and servers say, flow by flow, for the people implementing the protocol.

Starts Apache RocketMQ 5.5.0 (benchmarks/peers.py) listening on 127.0.0.1 but advertising 127.0.0.2, puts a
:class:`remoting_capture.CaptureRelay` on 127.0.0.2 at the same ports (so the clients' routes lead through it),
and runs each flow's clients (the Java drivers of tests/java, and mqadmin) against 127.0.0.2.  Each flow's
frames go to ``<out>/<flow>.txt``; ``=== ...`` lines mark its steps.  Brokers talk to the name server directly
(their REGISTER_BROKER traffic is not in the transcripts).

    .venv/bin/python tests/capture_flows.py --out /work/captures            # every flow
    .venv/bin/python tests/capture_flows.py --out /tmp/c producer litepull  # some
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from java_clients import DriverResult, JavaClient, mqadmin, run_driver  # noqa: E402
from remoting_capture import CaptureRelay  # noqa: E402

#: The address the servers advertise and the relay listens on; they listen on 127.0.0.1.
RELAY_HOST = "127.0.0.2"
#: Broker settings that make the flows quick: short delay levels (retries come back in a second), fast
#: transaction check-backs, SQL92 filtering on.
CAPTURE_BROKER = {"messageDelayLevel": "1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
                  "transactionTimeOut": 2000, "transactionCheckInterval": 2000, "enablePropertyFilter": "true"}
#: ACL 2.0 on the broker: one admin user created at start; the brokers' own clients sign as it.
ACL_USER, ACL_PASSWORD = "rocketmq2", "12345678"
ACL_BROKER = {"authenticationEnabled": "true",
              "authenticationProvider":
                  "org.apache.rocketmq.auth.authentication.provider.DefaultAuthenticationProvider",
              "authenticationMetadataProvider":
                  "org.apache.rocketmq.auth.authentication.provider.LocalAuthenticationMetadataProvider",
              "initAuthenticationUser": json.dumps({"username": ACL_USER, "password": ACL_PASSWORD},
                                                   separators=(",", ":")),
              "innerClientAuthenticationCredentials": json.dumps({"accessKey": ACL_USER, "secretKey": ACL_PASSWORD},
                                                                  separators=(",", ":"))}


@dataclass
class Capture:
    """One running capture setup: the servers, the relay routes, and where transcripts and client logs go."""

    rmq: peers.RocketMQ
    out: Path
    work: Path
    relay: CaptureRelay | None = None

    @property
    def namesrv(self) -> str:
        """The name server as the captured clients see it (through the relay)."""
        return self.rmq.namesrv

    def routes(self) -> tuple[dict[str, str], dict[str, str]]:
        """Relay routes (advertised -> bound) for the name servers and brokers, and their labels."""
        routes, names = {}, {}
        for i, addr in enumerate(self.rmq.namesrv_addrs):
            routes[addr] = addr.replace(RELAY_HOST, self.rmq.bind_host)
            names[addr] = f"namesrv{i}"
        for b in self.rmq.brokers:
            routes[b.addr] = b.addr.replace(RELAY_HOST, self.rmq.bind_host)
            names[b.addr] = f"{b.name}(id {b.broker_id})"
        return routes, names

    def begin(self, flow: str, title: str) -> None:
        """Open ``<out>/<flow>.txt`` (replaced) and relay into it."""
        path = self.out / f"{flow}.txt"
        path.unlink(missing_ok=True)
        routes, names = self.routes()
        self.relay = CaptureRelay(routes, path, names).start()
        self.relay.mark(f"{flow}: {title}")

    def mark(self, text: str) -> None:
        """A step of the flow."""
        assert self.relay is not None
        self.relay.mark(text)

    def end(self) -> None:
        """Close the transcript."""
        if self.relay is not None:
            self.relay.mark(f"end ({self.relay.frames} frames)")
            self.relay.stop()
            self.relay = None

    def run(self, mode: str, *args: str, timeout: float = 120.0) -> DriverResult:
        """A driver run to its end against the relayed name server; its errors fail the flow."""
        result = run_driver(mode, "--namesrv", self.namesrv, *args, work_dir=self.work, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{mode} {args}: exit {result.returncode}, {result.errors[:3]}\n{result.stderr}")
        return result

    def start(self, mode: str, *args: str) -> JavaClient:
        """A long-running driver (stopped with ``.stop()``)."""
        return JavaClient.start(None, mode, "--namesrv", self.namesrv, *args, work_dir=self.work)

    def admin(self, command: str, *args: str) -> str:
        """mqadmin through the relay; its stdout."""
        result = mqadmin(self.namesrv, command, *args, work_dir=self.work)
        self.mark(f"mqadmin {command} exit {result.returncode}; stdout:\n" + "\n".join(
            f"    | {line}" for line in result.stdout.strip().splitlines()[-30:]))
        return result.stdout


def _received(client: JavaClient, n: int, timeout: float = 60.0) -> list[dict]:
    return client.wait_count("received", n, timeout)


def flow_producer(c: Capture) -> None:
    """Producer start, sync/async/oneway sends, a batch, a delayed message, a send that auto-creates a topic,
    and the same producer speaking the ROCKETMQ (binary) header encoding."""
    c.admin("updateTopic", "-c", c.rmq.cluster, "-t", "CapTopic", "-r", "4", "-w", "4")
    c.mark("producer: start, 2 sync sends with tags and keys and a user property (topic exists)")
    c.run("produce", "--topic", "CapTopic", "--count", "2", "--tags", "TagA", "--keys-prefix", "key-",
          "--prop", "color=blue")
    c.mark("producer: start, 2 async sends, 2 one-way sends")
    c.run("produce", "--topic", "CapTopic", "--count", "2", "--send", "async")
    c.run("produce", "--topic", "CapTopic", "--count", "2", "--send", "oneway")
    c.mark("producer: a batch of 4 (SEND_BATCH_MESSAGE)")
    c.run("produce", "--topic", "CapTopic", "--count", "4", "--send", "batch", "--batch-size", "4")
    c.mark("producer: a message with delay level 2, one ordered by a MessageQueueSelector")
    c.run("produce", "--topic", "CapTopic", "--count", "1", "--delay-level", "2")
    c.run("produce", "--topic", "CapTopic", "--count", "1", "--send", "ordered")
    c.mark("producer: a send to a topic that does not exist (auto-created through TBW102)")
    c.run("produce", "--topic", "CapAutoCreated", "--count", "1")
    c.mark("producer: a body over 4 KiB (compressed by the client)")
    c.run("produce", "--topic", "CapTopic", "--count", "1", "--body-size", "6000")
    c.mark("producer: sync send and batch with -Drocketmq.serialize.type=ROCKETMQ (binary headers)")
    c.run("produce", "--topic", "CapTopic", "--count", "1", "--serialize-type", "ROCKETMQ")
    c.run("produce", "--topic", "CapTopic", "--count", "2", "--send", "batch", "--serialize-type", "ROCKETMQ")


def flow_push_consumer(c: Capture) -> None:
    """Push consumer start, heartbeat, rebalance, long polls (one held until it returns empty), a second member
    joining (NOTIFY_CONSUMER_IDS_CHANGED) and leaving, offset commits."""
    c.admin("updateTopic", "-c", c.rmq.cluster, "-t", "CapPush", "-r", "4", "-w", "4")
    c.run("produce", "--topic", "CapPush", "--count", "4")
    c.mark("push consumer 1: start (clustering, from first offset), consume the 4 messages")
    one = c.start("push", "--group", "CapPushGroup", "--topic", "CapPush", "--no-body")
    _received(one, 4)
    c.mark("push consumer 1: idle 20 s: long polls held 15 s by the broker, then answered empty")
    time.sleep(20)
    c.mark("push consumer 2 joins the group: the broker notifies member 1; both rebalance")
    two = c.start("push", "--group", "CapPushGroup", "--topic", "CapPush", "--no-body")
    two.wait_for(lambda evs: any(e["event"] == "assignment" and e["queues"] for e in evs), 60, "queues for member 2")
    c.mark("a producer sends 8 more; both members consume; offsets are committed (every 5 s and on pulls)")
    c.run("produce", "--topic", "CapPush", "--count", "8")
    time.sleep(8)
    c.mark("push consumer 2 leaves (UNREGISTER_CLIENT); member 1 is notified and takes all queues")
    two.stop()
    time.sleep(5)
    c.mark("push consumer 1 stops")
    one.stop()


def flow_orderly(c: Capture) -> None:
    """Orderly push consumer: LOCK_BATCH_MQ on rebalance and every 20 s, UNLOCK_BATCH_MQ at shutdown."""
    c.admin("updateTopic", "-c", c.rmq.cluster, "-t", "CapOrder", "-r", "2", "-w", "2")
    c.run("produce", "--topic", "CapOrder", "--count", "4", "--send", "ordered", "--order-keys", "2")
    c.mark("orderly consumer: start, lock its queues, consume 4 ordered messages")
    one = c.start("push", "--group", "CapOrderGroup", "--topic", "CapOrder", "--orderly", "--no-body")
    _received(one, 4)
    c.mark("orderly consumer: wait 22 s for the periodic lock renewal")
    time.sleep(22)
    c.mark("orderly consumer: stop (unlock)")
    one.stop()


def flow_reconsume_later(c: Capture) -> None:
    """RECONSUME_LATER: CONSUMER_SEND_MSG_BACK, the retry topic redelivered with growing reconsume times, then the
    message moved to %DLQ% after maxReconsumeTimes (2); the DLQ read back by a lite pull consumer."""
    c.run("produce", "--topic", "CapRetry", "--count", "1", "--keys-prefix", "retry-me-")
    c.mark("push consumer (maxReconsumeTimes 2, route polled every 1 s) answers RECONSUME_LATER every time")
    one = c.start("push", "--group", "CapRetryGroup", "--topic", "CapRetry", "--later-all",
                  "--max-reconsume-times", "2", "--poll-namesrv-ms", "1000", "--rebalance-ms", "2000")
    _received(one, 3, 120)
    time.sleep(5)
    one.stop()
    c.mark("the dead letter in %DLQ%CapRetryGroup, read with a lite pull consumer")
    c.run("litepull", "--topic", "%DLQ%CapRetryGroup", "--group", "CapDlqReader", "--count", "1",
          "--duration-s", "30")


def flow_transaction(c: Capture) -> None:
    """TransactionMQProducer: half messages committed, rolled back, and one left UNKNOW that the broker's
    CHECK_TRANSACTION_STATE resolves (answered UNKNOW once, then COMMIT)."""
    c.mark("transaction producer: commit, rollback, unknown; check-backs answered unknown once, then commit")
    c.run("transaction", "--topic", "CapTx", "--group", "CapTxProducer", "--count", "3",
          "--states", "commit,rollback,unknown", "--check-answer", "commit", "--check-unknown-first", "1",
          "--wait-resolved", "--duration-s", "90", timeout=150)
    c.mark("a consumer sees the committed ones")
    c.run("litepull", "--topic", "CapTx", "--group", "CapTxReader", "--count", "2", "--duration-s", "30")


def flow_litepull(c: Capture) -> None:
    """DefaultLitePullConsumer: assign + seek + commitSync; then subscribe (rebalance, group offsets)."""
    c.admin("updateTopic", "-c", c.rmq.cluster, "-t", "CapLite", "-r", "2", "-w", "2")
    c.run("produce", "--topic", "CapLite", "--count", "6")
    c.mark("lite pull, assign queue 0 and 1, seek queue 0 to offset 1, poll, commitSync")
    c.run("litepull", "--topic", "CapLite", "--group", "CapLiteAssign", "--assign", "all", "--seek", "0:1",
          "--commit", "sync", "--count", "5", "--duration-s", "30")
    c.mark("lite pull, subscribe (the group's offsets; auto-commit)")
    c.run("litepull", "--topic", "CapLite", "--group", "CapLiteSub", "--subscribe", "--count", "6",
          "--duration-s", "40")


def flow_sql92(c: Capture) -> None:
    """A push consumer subscribed with MessageSelector.bySql (broker enablePropertyFilter=true)."""
    c.run("produce", "--topic", "CapSql", "--count", "4", "--prop", "n={i}", "--tags", "TagA,TagB")
    c.mark("push consumer: bySql(\"n > 1 AND TAGS = 'TagA'\")")
    one = c.start("push", "--group", "CapSqlGroup", "--topic", "CapSql", "--sql", "n > 1 AND TAGS = 'TagA'")
    _received(one, 1)
    time.sleep(3)
    one.stop()


def run_mqadmin_flows(c: Capture) -> None:
    """One transcript per mqadmin command (``mqadmin-<command>.txt``), on a topic with a few messages and a
    consumer group with committed offsets.  consumerConnection and resetOffsetByTime run while the group's push
    consumer is online (its own pulls and heartbeats are in those two transcripts; resetOffsetByTime makes the
    broker push RESET_CONSUMER_CLIENT_OFFSET to it); the rest run after it stopped."""
    c.begin("mqadmin-setup", "a topic, messages with keys, a consumer group with committed offsets")
    c.admin("updateTopic", "-c", c.rmq.cluster, "-t", "CapAdmin", "-r", "2", "-w", "2")
    sent = c.run("produce", "--topic", "CapAdmin", "--count", "4", "--keys-prefix", "adminkey-").events_of("sent")
    consumer = c.start("push", "--group", "CapAdminGroup", "--topic", "CapAdmin", "--no-body")
    _received(consumer, 4)
    time.sleep(6)  # offsets persisted
    c.end()
    cluster, broker = c.rmq.cluster, c.rmq.brokers[0].addr

    def capture(command: str, args: list[str], name: str | None = None) -> None:
        c.begin(name or f"mqadmin-{command}", f"mqadmin {command} {' '.join(args)}")
        c.admin(command, *args)
        c.end()
    capture("consumerConnection", ["-g", "CapAdminGroup"])
    capture("resetOffsetByTime", ["-g", "CapAdminGroup", "-t", "CapAdmin", "-s", "-1"])
    consumer.stop()
    for command, args in [
        ("updateTopic", ["-c", cluster, "-t", "CapAdminNew", "-r", "3", "-w", "3"]),
        ("topicList", []),
        ("topicRoute", ["-t", "CapAdmin"]),
        ("topicStatus", ["-t", "CapAdmin"]),
        ("clusterList", []),
        ("brokerStatus", ["-b", broker]),
        ("consumerProgress", ["-g", "CapAdminGroup"]),
        ("queryMsgByKey", ["-t", "CapAdmin", "-k", "adminkey-2"]),
        ("updateSubGroup", ["-c", cluster, "-g", "CapAdminSubGroup", "-r", "3"]),
        ("deleteTopic", ["-c", cluster, "-t", "CapAdminNew"]),
    ]:
        capture(command, args)
    # 5.5.0's queryMsgById requires -t; it takes an offsetMsgId or a UNIQ_KEY (the SendResult's msgId)
    capture("queryMsgById", ["-t", "CapAdmin", "-i", sent[0]["offsetMsgId"]], "mqadmin-queryMsgById-offsetMsgId")
    capture("queryMsgById", ["-t", "CapAdmin", "-i", sent[1]["msgId"]], "mqadmin-queryMsgById-uniqKey")


def flow_acl(c: Capture) -> None:
    """ACL 2.0 on the broker: a producer signing with AclClientRPCHook (right credentials, then a wrong secret),
    a consumer signing; mqadmin with the wrong credentials is not possible (it reads them from a file)."""
    c.mark(f"producer signing as {ACL_USER} (right secret)")
    c.run("produce", "--topic", "CapAcl", "--count", "2", "--ak", ACL_USER, "--sk", ACL_PASSWORD)
    c.mark("producer signing with a wrong secret")
    result = run_driver("produce", "--namesrv", c.namesrv, "--topic", "CapAcl", "--count", "1", "--ak", ACL_USER,
                        "--sk", "wrong-secret", "--retries", "0", work_dir=c.work)
    c.mark(f"(the wrong-secret producer exited {result.returncode}: {result.errors[:1]})")
    c.mark("producer without credentials")
    result = run_driver("produce", "--namesrv", c.namesrv, "--topic", "CapAcl", "--count", "1", "--retries", "0",
                        work_dir=c.work)
    c.mark(f"(the unsigned producer exited {result.returncode}: {result.errors[:1]})")
    c.mark(f"push consumer signing as {ACL_USER}")
    one = c.start("push", "--group", "CapAclGroup", "--topic", "CapAcl", "--ak", ACL_USER, "--sk", ACL_PASSWORD)
    _received(one, 2)
    one.stop()


FLOWS: dict[str, tuple[Callable[[Capture], None], str]] = {
    "producer": (flow_producer, "DefaultMQProducer start, sends of every kind, batch, auto-create, binary headers"),
    "push-consumer": (flow_push_consumer, "DefaultMQPushConsumer: heartbeat, rebalance, long poll, 2nd member, "
                                          "offset commits"),
    "orderly": (flow_orderly, "orderly push consumer: queue locks"),
    "reconsume-later": (flow_reconsume_later, "RECONSUME_LATER: send-back, retry topic, DLQ"),
    "transaction": (flow_transaction, "TransactionMQProducer: commit, rollback, unknown resolved by check-back"),
    "litepull": (flow_litepull, "DefaultLitePullConsumer: assign/seek/commit, subscribe"),
    "sql92": (flow_sql92, "MessageSelector.bySql subscription"),
}


def _start_rocketmq(root: Path, extra: dict[str, object]) -> peers.RocketMQ:
    rmq = peers.RocketMQ(root, advertise_host=RELAY_HOST, broker_heap="1g", commitlog_file_bytes=64 << 20)
    rmq.start_namesrv()
    rmq.start_broker("broker-a", extra=extra)
    return rmq


def main(argv: list[str] | None = None) -> None:
    """Run the named flows (all by default) and write their transcripts under ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the transcripts go")
    parser.add_argument("flows", nargs="*", help=f"flows: {', '.join([*FLOWS, 'mqadmin', 'acl'])} (default all)")
    args = parser.parse_args(argv)
    wanted = args.flows or [*FLOWS, "mqadmin", "acl"]
    args.out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="sparkmq-capture-"))
    try:
        plain = [f for f in wanted if f != "acl"]
        if plain:
            with _start_rocketmq(root / "rmq", CAPTURE_BROKER) as rmq:
                cap = Capture(rmq, args.out, root / "clients")
                for flow in plain:
                    print(f"capturing {flow}", flush=True)
                    started = time.monotonic()
                    if flow == "mqadmin":
                        run_mqadmin_flows(cap)
                    else:
                        fn, title = FLOWS[flow]
                        cap.begin(flow, title)
                        try:
                            fn(cap)
                        finally:
                            cap.end()
                    print(f"  {flow}: {time.monotonic() - started:.0f} s", flush=True)
        if "acl" in wanted:
            with _start_rocketmq(root / "rmq-acl", {**CAPTURE_BROKER, **ACL_BROKER}) as rmq:
                cap = Capture(rmq, args.out, root / "clients-acl")
                print("capturing acl", flush=True)
                cap.begin("acl", "ACL 2.0: requests signed by AclClientRPCHook")
                try:
                    flow_acl(cap)
                finally:
                    cap.end()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
