"""TLS on every listener, with real processes: a name server (HTTPS), a master that requires TLS on every port
(HTTP, remoting, gRPC, HA) and a slave that serves TLS but also takes plaintext on its binary ports.

The certificates are made here (a CA, and a server certificate for 127.0.0.1 it signs); clients verify them,
host name included.  Shown: a client with the cluster's CA sends and receives over remoting, HTTP and gRPC (the
official ``rocketmq-python-client``); plaintext and clients that do not trust the CA are refused where TLS is
required; the slave replicates from the master over TLS; a permissive port serves both.
"""
from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from tls_certs import Pki, make_pki

from procs import BROKER, NAMESRV, HttpsService, ProcessHarness, child_env, start_https, wait_until
from sparkmq.platform.client import ClientConfig, Message, Producer, PullConsumer
from sparkmq.platform.client.admin import AdminClient
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.protocol import RequestCode
from sparkmq.platform.common.tls import TlsSettings
from sparkmq.platform.remoting import RemotingConnection, RemotingError, new_event_loop

pytestmark = pytest.mark.cluster

INTERVAL_S = 0.5




@dataclass
class Cluster:
    pki: Pki
    tmp: Path
    namesrv: HttpsService
    master: HttpsService
    slave: HttpsService

    def config(self, **overrides: Any) -> ClientConfig:
        settings: dict[str, Any] = dict(namesrv_addrs=self.namesrv.addr, tls=True, tls_ca_file=self.pki.ca_file,
                                        route_refresh_interval_s=INTERVAL_S, heartbeat_interval_s=INTERVAL_S,
                                        long_poll_wait_ms=500, request_timeout_s=5.0, trace_enabled=False,
                                        offset_store_dir=self.tmp / "offsets")
        settings.update(overrides)
        return ClientConfig(**settings)

    def http(self) -> httpx.Client:
        return httpx.Client(verify=ssl.create_default_context(cafile=self.pki.ca_file), timeout=10)

    def ha(self, broker: HttpsService) -> dict[str, Any]:
        with self.http() as http:
            return http.get(f"{broker.url}/broker/ha").json()


@pytest.fixture(scope="module")
def cluster(module_procs: ProcessHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("tls")
    pki = make_pki(tmp / "pki")
    certs = ("--tls-cert-file", str(pki.cert_file), "--tls-key-file", str(pki.key_file))
    namesrv = start_https(module_procs, "namesrv", NAMESRV, "--scan-interval-s", "0.5", *certs)
    common = ("--namesrv", namesrv.addr, "--register-interval-s", str(INTERVAL_S), "--segment-size", str(8 << 20),
              "--broker-name", "broker-a", *certs, "--tls-ca-file", str(pki.ca_file))
    master = start_https(module_procs, "broker", BROKER, "--data-dir", str(tmp / "master"), *common, "--tls-required",
                    "--grpc-port", "0", "--ha-port", "0", want=("remoting", "grpc"))
    # The slave's remoting on a dedicated port too: only there can TLS and plaintext share a port (its HTTP port
    # with a certificate speaks TLS only, remoting included).
    slave = start_https(module_procs, "broker", BROKER, "--data-dir", str(tmp / "slave"), *common, "--role", "SLAVE",
                   "--broker-id", "1", "--remoting-port", "0", want=("remoting",))
    cluster = Cluster(pki, tmp, namesrv, master, slave)
    with AdminClient(cluster.config()) as admin:
        admin.create_topic("TlsTopic", read_queue_nums=2, write_queue_nums=2)
        wait_until(lambda: _routed(admin, "TlsTopic"), 20, "the route of TlsTopic")
    yield cluster


def _routed(admin: AdminClient, topic: str) -> bool:
    try:
        return len(admin.topic_route(topic).read_queues) == 2
    except Exception:
        return False


def _poll(consumer: PullConsumer, n: int) -> list[Any]:
    out: list[Any] = []

    def enough() -> bool:
        out.extend(consumer.poll(0.5))
        return len(out) >= n
    wait_until(enough, 20, lambda: f"{n} messages (got {len(out)})", interval=0)
    return out


@pytest.mark.parametrize("transport", ["remoting", "http"])
def test_client_with_the_cluster_ca_sends_and_receives(cluster: Cluster, transport: str) -> None:
    config = cluster.config(transport=transport)
    bodies = [f"{transport}-{i}-{uuid.uuid4().hex}".encode() for i in range(20)]
    with Producer(f"pg-{transport}", config) as producer:
        sent = [producer.send(Message("TlsTopic", body)) for body in bodies[:10]]
        sent += producer.send_batch([Message("TlsTopic", body) for body in bodies[10:]])
    assert all(r.status.name == "SEND_OK" for r in sent)
    consumer = PullConsumer(f"cg-{transport}-{uuid.uuid4().hex[:6]}", config, consume_from_where="FIRST_OFFSET")
    consumer.subscribe("TlsTopic")
    consumer.start()
    try:
        wanted = set(bodies)
        got = {m.body for m in _poll(consumer, 1)}

        def all_there() -> bool:
            got.update(m.body for m in consumer.poll(0.5))
            return wanted <= got
        wait_until(all_there, 20, lambda: f"{len(wanted - got)} of the sent bodies", interval=0)
    finally:
        consumer.shutdown()


def _remoting_ping(addr: str, ctx: Any) -> None:
    async def run() -> None:
        conn = await RemotingConnection.connect(addr, ssl_context=ctx, timeout=5)
        try:
            await conn.request(int(RequestCode.SPARKMQ_PING), timeout=5)
        finally:
            await conn.close()
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(run())


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_plaintext_and_untrusting_clients_are_refused_where_tls_is_required(cluster: Cluster) -> None:
    trusted = TlsSettings(ca_file=cluster.pki.ca_file, connect=True).client_context()
    _remoting_ping(cluster.master.remoting, trusted)  # the control: the same call with TLS is answered
    # Remoting: a plaintext client's request is never answered, the connection is closed.
    with pytest.raises(RemotingError):
        _remoting_ping(cluster.master.remoting, None)
    host, port = cluster.master.remoting.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as raw:
        raw.sendall(b"\x00" * 64)  # not a TLS ClientHello
        answer = _read_until_closed(raw)
        assert answer == b"" or answer[0] == 0x15, answer  # closed, at most after a TLS alert record: no answer
    # A client that does not trust the cluster's CA (the system's trust store) refuses the server.
    with pytest.raises(RemotingError, match="TLS handshake failed"):
        _remoting_ping(cluster.master.remoting, TlsSettings(connect=True).client_context())
    other = make_pki(cluster.tmp / "other", "other")
    with pytest.raises(RemotingError, match="TLS handshake failed"):
        _remoting_ping(cluster.master.remoting, TlsSettings(ca_file=other.ca_file, connect=True).client_context())
    # HTTP: plaintext gets no HTTP answer; HTTPS with the CA does.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{cluster.master.addr}/health", timeout=5)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{cluster.namesrv.addr}/cluster", timeout=5)
    with cluster.http() as http:
        assert http.get(f"{cluster.master.url}/health").status_code == 200
        assert http.get(f"{cluster.namesrv.url}/cluster").status_code == 200
    # gRPC: an insecure channel cannot call.
    with grpc.insecure_channel(cluster.master.grpc) as channel:
        with pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(channel).result(timeout=3)
    # The sparkmq client without TLS fails at the name server.
    with pytest.raises(SparkMQError) as refused:  # the name server lookup gets no answer over plaintext
        with Producer("pg-plain", cluster.config(tls=False, retry_times=0, send_timeout_s=2.0)) as producer:
            producer.send(Message("TlsTopic", b"never"))
    assert refused.value.code is ErrorCode.SERVICE_NOT_AVAILABLE, refused.value  # not a bug of the client's own


def test_permissive_port_serves_tls_and_plaintext(cluster: Cluster) -> None:
    trusted = TlsSettings(ca_file=cluster.pki.ca_file, connect=True).client_context()
    _remoting_ping(cluster.slave.remoting, trusted)
    _remoting_ping(cluster.slave.remoting, None)


def test_slave_replicates_over_tls(cluster: Cluster) -> None:
    # The master requires TLS on its HA port: a slave in sync has replicated over TLS.
    with Producer("pg-ha", cluster.config()) as producer:
        producer.send_batch([Message("TlsTopic", f"ha-{i}".encode()) for i in range(50)])
    wait_until(lambda: cluster.ha(cluster.master).get("in_sync_slaves") == 1, 20, "the slave in sync")
    wait_until(lambda: cluster.ha(cluster.master)["max_offset"] == cluster.ha(cluster.slave)["max_offset"], 20,
               "the slave caught up")
    slave = cluster.ha(cluster.slave)
    assert slave["connected"] and slave["max_offset"] > 0 and slave["last_error"] is None
    # The master's HA port refuses plaintext: a slave speaking plaintext never gets a WELCOME.
    master_ha = cluster.ha(cluster.master)
    assert master_ha["slaves"], master_ha


_OFFICIAL_CLIENT = textwrap.dedent('''
    import sys, time
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
    endpoint, topic, group = sys.argv[1:4]
    config = ClientConfiguration(endpoint, Credentials(), request_timeout=5)
    producer = Producer(config, (topic,), tls_enable=True)
    producer.startup()
    sent = set()
    try:
        for i in range(5):
            msg = Message()
            msg.topic = topic
            msg.body = f"grpc-{i}".encode()
            producer.send(msg)
            sent.add(msg.body)
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, 10, tls_enable=True)
    consumer.startup()
    got = set()
    try:
        deadline = time.time() + 30
        while not sent <= got and time.time() < deadline:
            for m in consumer.receive(32, 10):
                got.add(m.body)
                consumer.ack(m)
    finally:
        consumer.shutdown()
    print("SENT", len(sent), "GOT", len(sent & got), flush=True)
''')


def test_official_grpc_client_with_tls(cluster: Cluster) -> None:
    topic = f"TlsGrpc-{uuid.uuid4().hex[:6]}"
    with AdminClient(cluster.config()) as admin:
        admin.create_topic(topic, read_queue_nums=2, write_queue_nums=2)
        wait_until(lambda: _routed(admin, topic), 20, f"the route of {topic}")
    # The official client trusts gRPC's default roots: point them at the cluster's CA (its documented variable).
    env = child_env(GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=str(cluster.pki.ca_file))
    done = subprocess.run([sys.executable, "-c", _OFFICIAL_CLIENT, cluster.master.grpc, topic, "cg-grpc-tls"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert "SENT 5 GOT 5" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]


def test_tls_settings_refuse_bad_files_with_the_file_named(tmp_path: Path) -> None:
    pki, other = make_pki(tmp_path / "a", "a"), make_pki(tmp_path / "b", "b")
    with pytest.raises(ValueError, match="is not a readable file"):
        TlsSettings(tmp_path / "missing.pem", pki.key_file)
    with pytest.raises(ValueError, match="set both or neither"):
        TlsSettings(cert_file=pki.cert_file)
    with pytest.raises(ValueError, match="tls_required needs"):
        TlsSettings(required=True)
    with pytest.raises(ValueError, match="cannot use tls_cert_file"):
        TlsSettings(pki.cert_file, other.key_file)  # a key that is not the certificate's
    with pytest.raises(ValueError, match="tls_ca_file"):
        ClientConfig(namesrv_addrs="127.0.0.1:9876", tls=True, tls_ca_file=tmp_path / "nope.pem")
    ok = TlsSettings(pki.cert_file, pki.key_file, pki.ca_file)
    assert ok.enabled and ok.connects and ok.scheme == "https" and not ok.required
    assert not TlsSettings(pki.cert_file, pki.key_file, connect=False).connects


def test_gateway_serves_https_and_sends_over_tls(cluster: Cluster, module_procs: ProcessHarness) -> None:
    certs = ("--tls-cert-file", str(cluster.pki.cert_file), "--tls-key-file", str(cluster.pki.key_file),
             "--tls-ca-file", str(cluster.pki.ca_file))
    gateway = start_https(module_procs, "gateway", "sparkmq.api.gateway_main", "--namesrv", cluster.namesrv.addr,
                          *certs)
    with cluster.http() as http:
        answer = http.post(f"{gateway.url}/topics/TlsTopic/messages",
                           json={"body": "via the gateway", "body_encoding": "utf8"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "SEND_OK"
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{gateway.addr}/health", timeout=5)
