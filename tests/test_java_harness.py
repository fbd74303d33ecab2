"""The Java side of issues 27/28, proven against real Apache RocketMQ 5.5.0 (and the frame codec on its own).

The module starts RocketMQ's name server and broker from the jar cache (benchmarks/peers.py) listening on
127.0.0.1 and advertising 127.0.0.2, with a capture relay (tests/remoting_capture.py) on 127.0.0.2: every driver
and mqadmin run of the module goes through the relay, and its transcript is checked at the end.  What it shows is
that the drivers (tests/java, tests/java_clients.py) report what RocketMQ's own clients did -- so a test of sparkmq
with them tests sparkmq, not the harness.

The RocketMQ server jars are not fetched by setup (only the benchmark needs them): the module fetches them with
Maven.  Without Java, Maven or the network the module skips, except under CI=true, where it fails.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import java_scenarios as sc
import pytest
import remoting_capture as rc

ROOT = Path(__file__).resolve().parents[1]
RELAY_HOST = "127.0.0.2"
BROKER_CONF = {"messageDelayLevel": " ".join(["1s"] * 18), "transactionTimeOut": 6000,
               "transactionCheckInterval": 1000, "enablePropertyFilter": "true"}


# -- the frame codec (no JVM) ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", [rc.SERIALIZE_JSON, rc.SERIALIZE_ROCKETMQ])
def test_frame_round_trip(kind: int) -> None:
    """A frame encodes and decodes back to itself under both header encodings."""
    frame = rc.Frame(310, "JAVA", 513, 7, 0, None, {"a": "g", "i": "TAGS\x01x\x02"}, b"body", kind)
    data = rc.encode_frame(frame)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    back = rc.decode_frame(data[4:])
    assert (back.code, back.version, back.opaque, back.flag, back.ext_fields, back.body, back.serialize_type) == \
           (310, 513, 7, 0, {"a": "g", "i": "TAGS\x01x\x02"}, b"body", kind)


@pytest.mark.parametrize("payload", [b"", b"\x00\x00", b"\x00\x00\x00\x10{}", b"\x05\x00\x00\x02{}",
                                     b"\x00\x00\x00\x03{x}", b"\x00\x00\x00\x02[]"])
def test_bad_frames_raise_frame_error(payload: bytes) -> None:
    """Truncated headers, unknown serialize types and bad JSON are FrameError, nothing else."""
    with pytest.raises(rc.FrameError):
        rc.decode_frame(payload)


def test_stored_record_decodes() -> None:
    """A stored record built by hand (IPv4 hosts, 1-byte topic length) decodes field by field."""
    body, topic, props = b"hello", b"T", b"KEYS\x01k1\x02"
    rest = (b"\x00\x00\x00\x07" + b"\x00\x00\x00\x02" + b"\x00\x00\x00\x00" + (5).to_bytes(8, "big")
            + (100).to_bytes(8, "big") + b"\x00\x00\x00\x00" + (1).to_bytes(8, "big") + bytes([127, 0, 0, 1])
            + (5555).to_bytes(4, "big") + (2).to_bytes(8, "big") + bytes([127, 0, 0, 2]) + (10911).to_bytes(4, "big")
            + b"\x00\x00\x00\x03" + (0).to_bytes(8, "big") + len(body).to_bytes(4, "big") + body
            + bytes([len(topic)]) + topic + len(props).to_bytes(2, "big") + props)
    record = (8 + len(rest)).to_bytes(4, "big") + bytes.fromhex("DAA320A7") + rest
    [decoded] = rc.decode_records(record)
    assert decoded["queueId"] == 2 and decoded["queueOffset"] == 5 and decoded["physicalOffset"] == 100
    assert decoded["bornHost"] == "127.0.0.1:5555" and decoded["storeHost"] == "127.0.0.2:10911"
    assert decoded["reconsumeTimes"] == 3 and decoded["topic"] == "T" and decoded["properties"] == {"KEYS": "k1"}


# -- against Apache RocketMQ -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rocketmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """RocketMQ 5.5.0 (name server + broker) behind a capture relay; yields the harness with ``.relay`` and
    ``.work``; everything stopped by pid afterwards."""
    sc.need("java and javac", bool(shutil.which("java") and shutil.which("javac")), "install a JDK 17+")
    from sparkmq.platform.common import jars

    try:
        for name in ("rocketmq-client", "rocketmq-server"):
            jars.fetch(name, say=lambda _m: None)
    except jars.MissingJarsError as exc:
        sc.need("the RocketMQ jar sets", False, str(exc))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peers

    root = tmp_path_factory.mktemp("rocketmq")
    rmq = peers.RocketMQ(root, advertise_host=RELAY_HOST, broker_heap="768m", commitlog_file_bytes=64 << 20)
    try:
        rmq.start_namesrv()
        rmq.start_broker("broker-a", extra=BROKER_CONF)
        routes = {a: a.replace(RELAY_HOST, "127.0.0.1") for a in [*rmq.namesrv_addrs, rmq.brokers[0].addr]}
        rmq.relay = rc.CaptureRelay(routes, root / "transcript.txt").start()
        rmq.work = root / "clients"
        yield rmq
    finally:
        relay = getattr(rmq, "relay", None)
        if relay is not None:
            relay.stop()
        rmq.stop()


run, drain = sc.run, sc.drain


@pytest.mark.cluster
@pytest.mark.slow
def test_every_send_is_accounted_for(rocketmq) -> None:  # type: ignore[no-untyped-def]
    """Sync, async, one-way, batch, ordered and delayed sends: every id a `sent` event names is read back, with the
    same tags, keys, properties and body, and the same offsetMsgId, queue and offset (a delayed message is stored
    again when it is due: its SendResult names the copy in SCHEDULE_TOPIC_XXXX, the consumer the one delivered a
    second or more later)."""
    sc.every_send_is_accounted_for(rocketmq, "HarnessSends")


@pytest.mark.cluster
@pytest.mark.slow
def test_reconsume_later_then_dlq(rocketmq) -> None:  # type: ignore[no-untyped-def]
    """RECONSUME_LATER every time: deliveries with reconsume times 0, 1, 2, then the message is in %DLQ%<group>."""
    sc.reconsume_later_then_dlq(rocketmq, "HarnessRetry", "HarnessRetryGroup")


@pytest.mark.cluster
@pytest.mark.slow
def test_transactions_commit_rollback_and_check_back(rocketmq) -> None:  # type: ignore[no-untyped-def]
    """commit and rollback are final; an UNKNOW half message is checked back (answered UNKNOW once, then
    COMMIT) and then delivered; the rolled-back one never is.  (The broker checks a half message older than
    transactionTimeOut, 6 s here: with 1 s, and with 3 s in a CI run on a day at half speed, it also checked the
    settled ones, and in 3 of 7 runs (at 1 s) the commit answered by a check-back was never delivered -- RocketMQ's
    behaviour at that setting, not a driver's.)"""
    sc.transactions_commit_rollback_and_check_back(rocketmq, "HarnessTx", "HarnessTxProducer")


@pytest.mark.cluster
@pytest.mark.slow
def test_two_members_share_the_queues(rocketmq) -> None:  # type: ignore[no-untyped-def]
    """Clustering: one member holds all 4 queues; when a second joins each holds 2, disjoint; when it leaves the
    first has all 4 again."""
    sc.two_members_share_the_queues(rocketmq, "HarnessRebalance", "HarnessRebalanceGroup", 4)


@pytest.mark.cluster
@pytest.mark.slow
def test_orderly_consumer_locks_its_queues_and_keeps_order(rocketmq) -> None:  # type: ignore[no-untyped-def]
    """An orderly consumer reports its queues locked and gets each order key's messages in send order."""
    sc.orderly_consumer_locks_its_queues_and_keeps_order(rocketmq, "HarnessOrderly", "HarnessOrderlyGroup")


@pytest.mark.cluster
@pytest.mark.slow
def test_tag_and_sql_subscriptions(rocketmq) -> None:  # type: ignore[no-untyped-def]
    """A tag subscription and a MessageSelector.bySql subscription receive exactly their messages."""
    sc.tag_and_sql_subscriptions(rocketmq, "HarnessFilters", "HarnessTagGroup", "HarnessSqlGroup")


@pytest.mark.cluster
@pytest.mark.slow
def test_lite_pull_commit_is_where_the_next_one_starts(rocketmq) -> None:  # type: ignore[no-untyped-def]
    """A subscribed lite pull consumer commits after 5 of 10; the next member of its group reads the other 5."""
    sc.lite_pull_commit_is_where_the_next_one_starts(rocketmq, "HarnessLite", "HarnessLiteGroup")


@pytest.mark.cluster
@pytest.mark.slow
def test_mqadmin_commands_take_effect(rocketmq) -> None:  # type: ignore[no-untyped-def]
    """updateTopic creates a topic with the asked queue counts (topicRoute, topicList show it); deleteTopic
    removes it; queryMsgByKey finds a sent message."""
    from java_clients import mqadmin

    ns, cluster = rocketmq.namesrv, rocketmq.cluster
    out = mqadmin(ns, "updateTopic", "-c", cluster, "-t", "HarnessAdmin", "-r", "3", "-w", "3", work_dir=rocketmq.work)
    assert "success" in out.stdout, out.stdout + out.stderr
    route = mqadmin(ns, "topicRoute", "-t", "HarnessAdmin", work_dir=rocketmq.work).stdout
    # fastjson prints brokerAddrs with bare numeric keys ({0:"ip:port"}): not JSON, read the fields
    assert re.findall(r'"(read|write)QueueNums":(\d+)', route) == [("read", "3"), ("write", "3")]
    assert "HarnessAdmin" in mqadmin(ns, "topicList", work_dir=rocketmq.work).stdout.split()
    [sent] = run(rocketmq, "produce", "--topic", "HarnessAdmin", "--count", "1", "--keys-prefix", "admin-key-"
                 ).events_of("sent")
    found = mqadmin(ns, "queryMsgByKey", "-t", "HarnessAdmin", "-k", "admin-key-0", work_dir=rocketmq.work).stdout
    assert sent["msgId"] in found
    mqadmin(ns, "deleteTopic", "-c", cluster, "-t", "HarnessAdmin", work_dir=rocketmq.work)
    assert "HarnessAdmin" not in mqadmin(ns, "topicList", work_dir=rocketmq.work).stdout.split()


@pytest.mark.cluster
@pytest.mark.slow
def test_acl_hook_signs_as_rocketmq_describes(rocketmq) -> None:  # type: ignore[no-untyped-def]
    """A driver given --ak/--sk sends AccessKey and Signature extFields; the signature is HmacSHA1 over the sorted
    extField values and the body (the broker here has no ACL, so the sends succeed)."""
    rocketmq.relay.mark("acl")
    result = run(rocketmq, "produce", "--topic", "HarnessAcl", "--count", "1", "--ak", "harness-ak",
                 "--sk", "harness-sk", "--body", "signed")
    assert result.returncode == 0
    time.sleep(0.5)
    text = (rocketmq.relay.log_path).read_text()
    header = next(json.loads(line.split("json header: ", 1)[1]) for line in text[text.index("=== "):].splitlines()
                  if '"code":310' in line and "AccessKey" in line)
    ext = header["extFields"]
    signature = ext.pop("Signature")
    assert ext["AccessKey"] == "harness-ak"
    content = "".join(ext[k] for k in sorted(ext)).encode() + b"signed"
    assert signature == base64.b64encode(hmac.new(b"harness-sk", content, hashlib.sha1).digest()).decode()


@pytest.mark.cluster
@pytest.mark.slow
def test_the_relay_saw_and_decoded_the_traffic(rocketmq) -> None:  # type: ignore[no-untyped-def]
    """The module's transcript holds the requests the clients made, every response matched to its request, and
    pulled records decoded."""
    run(rocketmq, "produce", "--topic", "HarnessCapture", "--count", "2")
    drain(rocketmq, "HarnessCapture", 2)
    time.sleep(0.5)
    text = rocketmq.relay.log_path.read_text()
    for what in ("REQUEST code=105 GET_ROUTEINFO_BY_TOPIC", "REQUEST code=310 SEND_MESSAGE_V2",
                 "REQUEST code=34 HEART_BEAT", "REQUEST code=361 LITE_PULL_MESSAGE",
                 "RESPONSE code=0 SUCCESS to LITE_PULL_MESSAGE(361)", '"topic": "HarnessCapture"'):
        assert what in text, what
    assert "to unmatched" not in text and "undecodable" not in text
