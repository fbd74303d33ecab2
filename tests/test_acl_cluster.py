"""ACL across a cluster, with real processes: the cluster credential on the HA and DLedger ports, the master's
ACL copied to its slave, a slave's signed ``/broker/ha/sync`` poll, and the Spark source and sink with keys.

Every broker here has ACL on and the same bootstrap super user (``root``); ``cluster_secret`` differs per test:

* a slave without the cluster secret, or with a wrong one, is refused at the handshake (UNAUTHENTICATED, one log
  line and one audit line per address and reason however often it retries) and holds nothing; one with the
  right secret replicates, and gets the master's users and policies (create, delete, persisted over a restart);
* a DLedger group over TLS whose third member has a wrong secret: the two others elect a leader and commit, the
  third is refused by both and holds nothing until it is restarted with the right secret;
* ``format("sparkmq")`` reads (streaming) and writes with ``accessKey`` / ``secretKey``; without them the
  query fails with AUTHENTICATION_FAILED naming the options.
"""
from __future__ import annotations

import socket
import ssl
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from acl_users import ROOT

from procs import BROKER, LAKE_TABLE, NAMESRV, ProcessHarness, ServiceProcess, start_https, wait_until, write_conf
from sparkmq.platform.auth import Credentials
from sparkmq.platform.client import ClientConfig, Message, Producer
from sparkmq.platform.client.admin import AdminClient
from sparkmq.platform.client.remoting import SigningAuth
from sparkmq.platform.ha.cluster_auth import ClusterAuth

READER = Credentials("reader", "reader-secret-1")
KEEPER = Credentials("keeper", "keeper-secret-1")
LAKE = Credentials("lake", "lake-secret-1")
SECRET = "cluster-secret-0123456789"
WRONG_SECRET = "not-the-cluster-secret"
ACL = {"acl_enabled": True, "acl_super_user_access_key": ROOT.access_key,
       "acl_super_user_secret_key": ROOT.secret_key}


def _http(url: str, credentials: Credentials | None = ROOT, verify: Any = True) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=10, verify=verify, auth=SigningAuth(credentials) if credentials else None)


def _get(url: str, path: str, credentials: Credentials | None = ROOT, verify: Any = True) -> httpx.Response:
    with _http(url, credentials, verify) as http:
        return http.get(path)


def _add_user(http: httpx.Client, user: Credentials, entries: list[dict[str, Any]]) -> None:
    """Create ``user`` with a policy of ``entries`` (``http`` signed by a super user)."""
    assert http.post("/acl/users", json={"access_key": user.access_key,
                                         "secret_key": user.secret_key}).status_code == 200
    assert http.post("/acl/policies", json={"subject": user.access_key, "entries": entries}).status_code == 200


def _ha(broker: ServiceProcess) -> dict[str, Any]:
    resp = _get(broker.url, "/broker/ha")
    assert resp.status_code == 200, resp.text
    return resp.json()


def _slave_conf(tmp: Path, name: str, broker_id: int, **extra: Any) -> Path:
    return write_conf(tmp / f"{name}.toml", tmp / name, role="SLAVE", broker_id=broker_id,
                      ha_slave_sync_interval_s=1.0, **ACL, **extra)


def _start_slave(procs: ProcessHarness, namesrv: ServiceProcess, conf: Path) -> ServiceProcess:
    return procs.start("broker", BROKER, "--config", str(conf), "--namesrv", namesrv.addr,
                       "--register-interval-s", "0.5", "--no-auto-create-topic")


def _master(procs: ProcessHarness, tmp: Path, **extra: Any) -> tuple[ServiceProcess, ServiceProcess]:
    namesrv = procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
    conf = write_conf(tmp / "master.toml", tmp / "master", **ACL, **extra)
    master = procs.start("broker", BROKER, "--config", str(conf), "--namesrv", namesrv.addr,
                         "--register-interval-s", "0.5", "--ha-port", "0", "--no-trace")
    return namesrv, master


def _client_config(namesrv: ServiceProcess, tmp: Path, credentials: Credentials = ROOT, **extra: Any) -> ClientConfig:
    return ClientConfig(namesrv_addrs=namesrv.addr, request_timeout_s=5.0, route_refresh_interval_s=0.5,
                        offset_store_dir=str(tmp / "offsets"), trace_enabled=False,
                        access_key=credentials.access_key, secret_key=credentials.secret_key, **extra)


def _send(namesrv: ServiceProcess, tmp: Path, topic: str, n: int, **extra: Any) -> None:
    config = _client_config(namesrv, tmp, **extra)
    with AdminClient(config) as admin:
        admin.create_topic(topic, read_queue_nums=1, write_queue_nums=1)
        wait_until(lambda: _routed(admin, topic), 20, f"the route of {topic}")
    with Producer(f"pg-{uuid.uuid4().hex[:6]}", config) as producer:
        producer.send_batch([Message(topic, f"m-{i}".encode()) for i in range(n)])


def _routed(admin: AdminClient, topic: str) -> bool:
    try:
        return len(admin.topic_route(topic).read_queues) >= 1
    except Exception:
        return False


def _read(broker: ServiceProcess, topic: str, credentials: Credentials) -> httpx.Response:
    return _get(broker.url, f"/topics/{topic}/queues/0/messages?offset=0&max=100", credentials)


# -- the handshake, in process ------------------------------------------------------------------------------

def test_cluster_proofs_refuse_wrong_secrets_stale_times_and_replays() -> None:
    now = [1_700_000_000.0]
    master = ClusterAuth(SECRET, required=True, clock_skew_s=60, clock=lambda: now[0])
    slave = ClusterAuth(SECRET, required=True, clock_skew_s=60, clock=lambda: now[0])
    stranger = ClusterAuth(WRONG_SECRET, required=True, clock=lambda: now[0])
    proof = slave.prove("HA", "broker-a/1", b"hello")
    assert master.check("HA", "broker-a/1", proof, b"hello") is None
    assert slave.check_answer("HA", "broker-a/1", proof, master.answer("HA", "broker-a/1", proof, b"hello"), b"hello")
    assert not slave.check_answer("HA", "broker-a/1", proof, stranger.answer("HA", "broker-a/1", proof, b"hello"),
                                  b"hello")  # an impostor master cannot answer
    assert master.check("HA", "broker-a/1", proof, b"hello") == "replayed handshake (nonce seen before)"
    assert master.check("HA", "broker-a/2", slave.prove("HA", "broker-a/1", b"hello"), b"hello") \
        == "wrong cluster secret"  # bound to the identity it was made for
    assert master.check("HA", "broker-a/1", stranger.prove("HA", "broker-a/1", b"hi"), b"hi") == "wrong cluster secret"
    assert master.check("HA", "broker-a/1", None) is not None
    old = slave.prove("HA", "broker-a/1")
    now[0] += 61
    assert "away from this clock" in (master.check("HA", "broker-a/1", old) or "")
    assert SECRET not in repr(master)
    with pytest.raises(ValueError):
        ClusterAuth("short", required=True)


# -- the HA port --------------------------------------------------------------------------------------------

def test_ha_refuses_slaves_without_the_cluster_secret_and_replicates_to_one_with_it(
        procs: ProcessHarness, tmp_path: Path) -> None:
    namesrv, master = _master(procs, tmp_path, cluster_secret=SECRET)
    _send(namesrv, tmp_path, "ha-acl", 20)
    master_max = _ha(master)["max_offset"]
    assert master_max > 0
    absent = _start_slave(procs, namesrv, _slave_conf(tmp_path, "absent", 1))
    wrong = _start_slave(procs, namesrv, _slave_conf(tmp_path, "wrong", 2, cluster_secret=WRONG_SECRET))
    # Refused at every attempt (a slave retries every 5 s): wait for a retry of each, so "logged once" is shown.
    wait_until(lambda: _ha(master)["refused"].get("UNAUTHENTICATED", 0) >= 4, 30, "both slaves refused twice")
    for slave in (absent, wrong):
        status = _ha(slave)
        assert not status["connected"] and "UNAUTHENTICATED" in status["last_error"], status
        assert status["max_offset"] == 0, status  # nothing replicated
    assert _ha(master)["slaves"] == []
    log = master.log()
    refusals = [line for line in log.splitlines() if "refused a connection from" in line]
    assert len(refusals) == 2, refusals  # one per address and reason, not one per attempt
    assert any("no cluster credential" in line for line in refusals)
    assert any("wrong cluster secret" in line for line in refusals)
    assert log.count("denied user=cluster") == 2
    assert SECRET not in log and WRONG_SECRET not in log and SECRET not in wrong.log()
    # The right secret: the slave replicates the whole log and keeps up.
    good = _start_slave(procs, namesrv, _slave_conf(tmp_path, "good", 3, cluster_secret=SECRET))
    wait_until(lambda: _ha(good)["max_offset"] == _ha(master)["max_offset"], 20, "the slave caught up")
    slaves = _ha(master)["slaves"]
    assert [s["broker_id"] for s in slaves] == [3] and slaves[0]["authenticated"], slaves
    assert _ha(absent)["max_offset"] == 0 and _ha(wrong)["max_offset"] == 0
    assert SECRET not in good.log() and SECRET not in master.log()


def test_the_masters_acl_reaches_its_slave_and_survives_a_restart(procs: ProcessHarness, tmp_path: Path) -> None:
    namesrv, master = _master(procs, tmp_path, cluster_secret=SECRET)
    _send(namesrv, tmp_path, "acl-repl", 5)
    slave_conf = _slave_conf(tmp_path, "slave", 1, cluster_secret=SECRET)
    slave = _start_slave(procs, namesrv, slave_conf)
    wait_until(lambda: _ha(slave)["max_offset"] == _ha(master)["max_offset"], 20, "the slave caught up")
    # The slave's topic table came from its signed /broker/ha/sync poll (ACL on: an unsigned one is refused).
    wait_until(lambda: _get(slave.url, "/topics/acl-repl").status_code == 200, 20, "the topic on the slave")
    assert _read(slave, "acl-repl", READER).status_code == 401  # no such user yet
    with _http(master.url) as http:
        for user in (READER, KEEPER):
            _add_user(http, user, [{"resource": "Topic:acl-*", "actions": ["Sub"]}])
    # Created on the master: the slave serves the user within seconds (the master pushes every change).
    wait_until(lambda: _read(slave, "acl-repl", READER).status_code == 200, 10, "reader allowed on the slave")
    assert len(_read(slave, "acl-repl", READER).json()["messages"]) == 5
    assert _read(slave, "acl-repl", Credentials("reader", "guessed-secret")).status_code == 401
    with _http(master.url) as http:
        assert http.delete(f"/acl/users/{READER.access_key}").json()["deleted"]
    wait_until(lambda: _read(slave, "acl-repl", READER).status_code == 401, 10, "reader refused on the slave")
    assert _read(slave, "acl-repl", KEEPER).status_code == 200
    assert "denied user=reader" in slave.log()
    # Restarted while its master is down: the slave still enforces the copied table (it is on its disk).
    master.stop()
    slave.stop()
    slave = _start_slave(procs, namesrv, slave_conf)
    assert _read(slave, "acl-repl", KEEPER).status_code == 200
    assert _read(slave, "acl-repl", READER).status_code == 401
    assert SECRET not in slave.log() and KEEPER.secret_key not in slave.log()


def test_the_lakes_offset_sampling_signs_with_its_keys(procs: ProcessHarness, tmp_path: Path) -> None:
    """The report job's lag samples (``pipelines.reports.BrokerOffsets``) are signed with the lake's keys: with
    them a broker with ACL on answers every queue's lag; without, it refuses and the job samples nothing."""
    from sparkmq.pipelines.reports import QueueSample, offsets_source
    from sparkmq.platform.client import BrokerClient

    namesrv, master = _master(procs, tmp_path)
    _send(namesrv, tmp_path, "acl-lag", 6)
    with _http(master.url) as http:
        _add_user(http, LAKE, [{"resource": "Cluster", "actions": ["List"]},
                               {"resource": "Group:*", "actions": ["Get"]}])
    root = BrokerClient(master.addr, 5.0, credentials=ROOT)
    try:
        assert root.commit_offsets("lagging", [{"topic": "acl-lag", "queue_id": 0, "offset": 2}]) == 1
    finally:
        root.close()
    signed, unsigned = offsets_source(namesrv.addr, credentials=LAKE), offsets_source(namesrv.addr)
    try:
        wait_until(lambda: signed.masters(), 20, "the master registered")
        assert signed.sample(["lagging"]) == [QueueSample("lagging", "acl-lag", "broker-a", 0, 2, 6, 4)]
        assert unsigned.sample(["lagging"]) == [], "an unsigned sample is refused, not read"
    finally:
        signed.close()
        unsigned.close()
    assert "denied user=-" in master.log() and LAKE.secret_key not in master.log()


# -- DLedger over TLS ---------------------------------------------------------------------------------------

MEMBERS = ("n0", "n1", "n2")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_https(procs: ProcessHarness, module: str, *args: str) -> ServiceProcess:
    """A service serving TLS; its ``url`` is the HTTPS one."""
    service = start_https(procs, module.rsplit(".", 1)[-1], module, *args)
    service.proc.url = service.url
    return service.proc


@pytest.mark.slow
def test_dledger_over_tls_refuses_a_member_with_a_wrong_cluster_secret(procs: ProcessHarness,
                                                                      tmp_path: Path) -> None:
    from tls_certs import make_pki

    pki = make_pki(tmp_path / "pki")
    verify = ssl.create_default_context(cafile=str(pki.ca_file))
    namesrv = _start_https(procs, NAMESRV, "--scan-interval-s", "0.5", "--tls-cert-file", str(pki.cert_file),
                           "--tls-key-file", str(pki.key_file))
    namesrv_addr = namesrv.url.removeprefix("https://")
    ports = {m: _free_port() for m in MEMBERS}
    peers = ";".join(f"{m}-127.0.0.1:{p}" for m, p in sorted(ports.items()))
    tls = {"tls_cert_file": str(pki.cert_file), "tls_key_file": str(pki.key_file), "tls_ca_file": str(pki.ca_file),
           "tls_required": True}

    def args(member: str, secret: str) -> list[str]:
        conf = write_conf(tmp_path / f"{member}.toml", tmp_path / member, dledger_enabled=True, dledger_self_id=member,
                          dledger_peers=peers, dledger_heartbeat_ms=300, cluster_secret=secret, **ACL, **tls)
        return ["--config", str(conf), "--namesrv", namesrv_addr, "--register-interval-s", "0.5", "--segment-size",
                str(8 << 20)]

    brokers = {m: _start_https(procs, BROKER, *args(m, SECRET if m != "n2" else WRONG_SECRET)) for m in MEMBERS}

    def status(member: str) -> dict[str, Any]:
        resp = _get(brokers[member].url, "/broker/dledger", verify=verify)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def leader() -> str | None:
        return next((m for m in ("n0", "n1") if status(m)["role"] == "LEADER"), None)

    wait_until(leader, 30, "n0 or n1 leading")
    config = ClientConfig(namesrv_addrs=namesrv_addr, request_timeout_s=5.0, route_refresh_interval_s=0.5,
                          offset_store_dir=str(tmp_path / "offsets"), trace_enabled=False, tls=True,
                          tls_ca_file=str(pki.ca_file), access_key=ROOT.access_key, secret_key=ROOT.secret_key)
    with AdminClient(config) as admin:
        admin.create_topic("dl-acl", read_queue_nums=1, write_queue_nums=1)
        wait_until(lambda: _routed(admin, "dl-acl"), 20, "the route of dl-acl")
    with Producer("pg-dl", config) as producer:
        results = producer.send_batch([Message("dl-acl", f"d-{i}".encode()) for i in range(10)])
    assert all(str(r.status) == "SEND_OK" for r in results), results
    lead = leader()
    assert lead is not None
    commit = status(lead)["commit_offset"]
    wait_until(lambda: {status(m)["commit_offset"] for m in ("n0", "n1")} == {commit}, 20, "n0 and n1 committed")
    assert status("n2")["log_end"] == 0  # refused by both: nothing replicated to it
    # Both refuse n2's connections (its elections), and n2 refuses theirs (the leader's appends).
    wait_until(lambda: all(status(m)["refused"].get("unauthenticated", 0) >= 1 for m in ("n0", "n1")), 20,
               lambda: f"n0 and n1 refusing n2: {[status(m)['refused'] for m in MEMBERS]}")
    assert status("n2")["refused"].get("unauthenticated", 0) >= 1
    assert "wrong cluster secret" in brokers[lead].log() and WRONG_SECRET not in brokers[lead].log()
    # The right secret: n2 joins and holds the committed log.
    brokers["n2"].stop()
    brokers["n2"] = _start_https(procs, BROKER, *args("n2", SECRET))
    wait_until(lambda: status("n2")["commit_offset"] >= commit and status("n2")["log_end"] >= commit, 30,
               "n2 caught up")
    # The leader's ACL reaches every follower (created, then deleted, on the leader only).
    lead = leader() or wait_until(leader, 30, "a leader")
    followers = [m for m in MEMBERS if m != lead]

    def stats_as_reader(member: str) -> int:
        return _get(brokers[member].url, "/topics/dl-acl/stats", READER, verify=verify).status_code

    with _http(brokers[lead].url, verify=verify) as http:
        _add_user(http, READER, [{"resource": "Topic:dl-*", "actions": ["Get"]}])
    wait_until(lambda: all(stats_as_reader(m) == 200 for m in followers), 15, "reader allowed on the followers")
    with _http(brokers[lead].url, verify=verify) as http:
        assert http.delete(f"/acl/users/{READER.access_key}").json()["deleted"]
    wait_until(lambda: all(stats_as_reader(m) == 401 for m in followers), 15, "reader refused on the followers")


# -- the Spark source and sink --------------------------------------------------------------------------------

@pytest.fixture
def sq(spark: Any) -> Any:
    from sparkmq.pipelines.source import register

    register(spark)
    return spark


@pytest.mark.spark
@pytest.mark.timeout(240)
def test_spark_source_and_sink_sign_with_access_keys(sq: Any, procs: ProcessHarness, tmp_path: Path) -> None:
    namesrv, broker = _master(procs, tmp_path)
    _send(namesrv, tmp_path, "lake-acl-src", 15)
    with _http(broker.url) as http:
        _add_user(http, LAKE, [{"resource": "Topic:lake-acl-*", "actions": ["Pub", "Sub", "Get"]}])
        assert http.post("/topics", json={"topic": "lake-acl-dst", "read_queue_nums": 1,
                                          "write_queue_nums": 1}).status_code == 200
    keys = {"accessKey": LAKE.access_key, "secretKey": LAKE.secret_key}

    def reader(stream: bool, **options: str) -> Any:
        r = (sq.readStream if stream else sq.read).format("sparkmq").option("namesrv", namesrv.addr) \
            .option("subscribe", "lake-acl-src").option("startingOffsets", "earliest")
        for k, v in options.items():
            r = r.option(k, v)
        return r.load()

    # A streaming read with the keys gets everything, and its rows go back out through the sink with the keys.
    got: list[bytes] = []
    query = (reader(True, **keys).select("body").writeStream
             .foreachBatch(lambda df, _id: got.extend(bytes(r.body) for r in df.collect()))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert query.awaitTermination(120) and query.exception() is None
    assert sorted(got) == sorted(f"m-{i}".encode() for i in range(15))
    df = sq.createDataFrame([(b,) for b in got], "body binary")
    sink = df.write.format("sparkmq").mode("append").option("namesrv", namesrv.addr).option("topic", "lake-acl-dst")
    for k, v in keys.items():
        sink = sink.option(k, v)
    sink.save()
    stats = _get(broker.url, "/topics/lake-acl-dst/stats").json()
    assert sum(q["max_offset"] for q in stats["queues"]) == 15
    # Without keys (or with a wrong secret): a clear error, naming the options.
    with pytest.raises(Exception, match=r"AUTHENTICATION_FAILED[\s\S]*accessKey"):
        reader(False).collect()
    with pytest.raises(Exception, match=r"AUTHENTICATION_FAILED[\s\S]*accessKey"):
        reader(False, accessKey=LAKE.access_key, secretKey="wrong-secret-1").collect()
    with pytest.raises(Exception, match=r"AUTHENTICATION_FAILED[\s\S]*accessKey"):
        df.write.format("sparkmq").mode("append").option("namesrv", namesrv.addr) \
            .option("topic", "lake-acl-dst").save()
    with pytest.raises(Exception, match="give 'accessKey' and 'secretKey' together"):
        reader(False, accessKey=LAKE.access_key).collect()
    assert sum(q["max_offset"] for q in _get(broker.url, "/topics/lake-acl-dst/stats").json()["queues"]) == 15


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_brokers_lake_signs_its_reads_when_acl_is_on(procs: ProcessHarness, tmp_path: Path) -> None:
    """The broker's own lake jobs read it with the ``[lake]`` keys: messages become findable by key."""
    namesrv = procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
    conf = write_conf(tmp_path / "lake.toml", tmp_path / "broker", **ACL)
    conf.write_text(conf.read_text() + f'''
{LAKE_TABLE}trigger_interval_s = 0.5
jobs = ["dispatch"]
access_key = "{ROOT.access_key}"
secret_key = "{ROOT.secret_key}"
[lake.spark_conf]
"spark.master" = "local[1]"
''')
    broker = procs.start("broker", BROKER, "--config", str(conf), "--lake", "--namesrv", namesrv.addr,
                         "--register-interval-s", "0.5")
    config = _client_config(namesrv, tmp_path)
    with AdminClient(config) as admin:
        admin.create_topic("lake-signed", read_queue_nums=1, write_queue_nums=1)
        wait_until(lambda: _routed(admin, "lake-signed"), 20, "the route of lake-signed")
    with Producer("pg-lake", config) as producer:
        producer.send_batch([Message("lake-signed", f"l-{i}".encode(), keys=(f"key-{i}",)) for i in range(5)])

    def found() -> bool:
        resp = _get(broker.url, "/query/messages?topic=lake-signed&key=key-3")
        return resp.status_code == 200 and bool(resp.json().get("messages"))
    wait_until(found, 180, lambda: f"key-3 indexed by the lake; broker log:\n{broker.log()[-3000:]}")
    assert "AUTHENTICATION_FAILED" not in broker.log() and ROOT.secret_key not in broker.log()
