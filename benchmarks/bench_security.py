"""Security benchmarks: what authentication and access control cost on the hot path, measured in one run.

    python benchmarks/bench_security.py [--quick] [--only NAME[,NAME]]

One line each:

* ``security.acl_overhead`` -- batched produce (binary remoting, the asyncio producer, batches of 256 x 1 KiB,
  4 in flight, as ``messaging.produce_batch``) against a broker with ACL on, over the same against a broker
  with ACL off; both run at once in their own processes (each with its own name server) and are measured in
  alternating rounds, so the machine's mood cancels out.  With ACL on every batch is signed by the client
  (HMAC-SHA256 over header and body) and verified and authorized by the broker (a user with a
  ``Pub`` policy on the topic, not a super user).  Target >= 0.9.  Also printed: ``cpu_ratio``, CPU per
  message (client and broker together) with ACL off over on, which the machine's other load moves less.
* ``security.tls_overhead`` -- the same batched produce against a platform serving TLS only (every port, the
  client verifying the server against the test CA), over the same against a plaintext platform; both run at
  once, measured in alternating rounds.  Target >= 0.7.  Also printed: ``cpu_ratio`` (plaintext over TLS).

Each figure is one function (``bench_<name>``) taking the run's settings; ``--only`` picks them.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
from bench_messaging import line  # the benchmarks' one line format (run as scripts: this folder is on the path)

from sparkmq.platform.auth import Credentials
from sparkmq.platform.client import AsyncProducer, ClientConfig, Message
from sparkmq.platform.client.remoting import SigningAuth

BODY = os.urandom(1024)
BATCH = 256
IN_FLIGHT = 4
TOPIC = "BenchAcl"
ROOT = Credentials("bench-root", "bench-root-secret")
USER = Credentials("bench-user", "bench-user-secret")


class Service:
    """A name server and one broker in child processes (no lake, no trace), optionally with ACL on."""

    def __init__(self, data_dir: Path, *, acl: bool) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.acl = acl
        data_dir.mkdir(parents=True, exist_ok=True)
        namesrv = self._start("sparkmq.api.namesrv_main", [])
        conf = data_dir / "broker.toml"
        settings = ['[broker]', f'data_dir = "{data_dir / "broker"}"', 'trace_enabled = false']
        if acl:
            settings += ["acl_enabled = true", f'acl_super_user_access_key = "{ROOT.access_key}"',
                         f'acl_super_user_secret_key = "{ROOT.secret_key}"']
        conf.write_text("\n".join(settings) + "\n[store]\nsegment_size = 1073741824\n")
        self.broker_url = self._start("sparkmq.api.broker_main", ["--config", str(conf), "--namesrv", namesrv,
                                                                  "--register-interval-s", "1"])
        self.namesrv = namesrv
        if acl:
            with httpx.Client(base_url=self.broker_url, auth=SigningAuth(ROOT), timeout=10) as http:
                http.post("/acl/users", json={"access_key": USER.access_key,
                                              "secret_key": USER.secret_key}).raise_for_status()
                http.post("/acl/policies", json={"subject": USER.access_key, "entries": [
                    {"resource": f"Topic:{TOPIC}*", "actions": ["Pub"]}]}).raise_for_status()
                http.post("/topics", json={"topic": TOPIC, "read_queue_nums": 4,
                                           "write_queue_nums": 4}).raise_for_status()
        else:
            httpx.post(f"{self.broker_url}/topics", json={"topic": TOPIC, "read_queue_nums": 4,
                                                          "write_queue_nums": 4}, timeout=10).raise_for_status()
        deadline = time.monotonic() + 30
        while httpx.get(f"http://{namesrv}/routes/{TOPIC}", timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise SystemExit("the bench topic never got a route")
            time.sleep(0.2)

    def _start(self, module: str, args: list[str]) -> str:
        proc = subprocess.Popen([sys.executable, "-m", module, "--host", "127.0.0.1", "--port", "0", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.procs.append(proc)
        ready = proc.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"listening on http://(\S+)", ready)
        if match is None:
            self.stop()
            raise SystemExit(f"{module} did not start: {ready!r}")
        return match.group(1) if "namesrv" in module else f"http://{match.group(1)}"

    def config(self) -> ClientConfig:
        keys = {"access_key": USER.access_key, "secret_key": USER.secret_key} if self.acl else {}
        return ClientConfig(namesrv_addrs=self.namesrv, trace_enabled=False, **keys)  # type: ignore[arg-type]

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            proc.wait(30)


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def produce_rate(service: Service, seconds: float) -> tuple[float, float]:
    """Batched produce over remoting for ``seconds`` (after a warm-up batch): (messages per second, CPU
    microseconds per message of this client and the broker together)."""
    batch = [Message(TOPIC, BODY) for _ in range(BATCH)]
    sent = [0]

    async def run() -> float:
        async with AsyncProducer("bench-acl", service.config()) as producer:
            await producer.send_batch(batch)  # warm-up: route and connection
            started = time.perf_counter()
            stop = started + seconds

            async def sender() -> int:
                sent = 0
                while time.perf_counter() < stop:
                    await producer.send_batch(batch)
                    sent += BATCH
                return sent
            sent[0] = sum(await asyncio.gather(*(sender() for _ in range(IN_FLIGHT))))
            return sent[0] / (time.perf_counter() - started)
    broker_pid = service.procs[-1].pid
    cpu = time.process_time() + _cpu_s(broker_pid)
    rate = asyncio.run(run())
    cpu = time.process_time() + _cpu_s(broker_pid) - cpu
    return rate, cpu / max(sent[0], 1) * 1e6


def bench_acl_overhead(quick: bool) -> None:
    """``security.acl_overhead``: produce rate with ACL on over ACL off, alternating rounds in one run."""
    rounds, seconds = (2, 2.0) if quick else (5, 4.0)
    with tempfile.TemporaryDirectory(prefix="sparkmq-bench-sec-") as tmp:
        off = Service(Path(tmp) / "off", acl=False)
        try:
            on = Service(Path(tmp) / "on", acl=True)
            try:
                rates: dict[bool, list[float]] = {True: [], False: []}
                cpus: dict[bool, list[float]] = {True: [], False: []}
                for i in range(rounds):
                    for acl in ((True, False) if i % 2 else (False, True)):  # ABBA: no order bias
                        rate, cpu_us = produce_rate(on if acl else off, seconds)
                        rates[acl].append(rate)
                        cpus[acl].append(cpu_us)
            finally:
                on.stop()
        finally:
            off.stop()
    on_rate, off_rate = statistics.median(rates[True]), statistics.median(rates[False])
    on_cpu, off_cpu = statistics.median(cpus[True]), statistics.median(cpus[False])
    # cpu_ratio: CPU per message (client + broker) with ACL off over on -- the same ratio, less moved by
    # whatever else the machine runs.
    line("security.acl_overhead", ratio=on_rate / off_rate, acl_on_msgs_per_s=on_rate, acl_off_msgs_per_s=off_rate,
         cpu_ratio=off_cpu / on_cpu, acl_on_cpu_us_per_msg=on_cpu, acl_off_cpu_us_per_msg=off_cpu, rounds=rounds,
         target=0.9)


class TlsService:
    """A name server and one broker (no lake, no trace) in child processes: TLS only on every port with ``pki``
    (the client trusts its CA), plaintext without."""

    def __init__(self, data_dir: Path, pki: Any | None) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.pki = pki
        tls = [] if pki is None else ["--tls-cert-file", str(pki.cert_file), "--tls-key-file", str(pki.key_file)]
        self.namesrv = self._start("sparkmq.api.namesrv_main", tls)
        broker_tls = [] if pki is None else [*tls, "--tls-ca-file", str(pki.ca_file), "--tls-required"]
        data_dir.mkdir(parents=True, exist_ok=True)
        conf = data_dir / "broker.toml"
        conf.write_text(f'[broker]\ndata_dir = "{data_dir / "broker"}"\ntrace_enabled = false\n'
                        "[store]\nsegment_size = 1073741824\n")
        self._start("sparkmq.api.broker_main", ["--config", str(conf), "--namesrv", self.namesrv,
                                                "--register-interval-s", "1", *broker_tls])

    def _start(self, module: str, args: list[str]) -> str:
        proc = subprocess.Popen([sys.executable, "-m", module, "--host", "127.0.0.1", "--port", "0", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.procs.append(proc)
        match = re.search(r"listening on https?://(\S+)", proc.stdout.readline())  # type: ignore[union-attr]
        if match is None:
            self.stop()
            raise SystemExit(f"{module} did not start")
        return match.group(1)

    def config(self) -> ClientConfig:
        return ClientConfig(namesrv_addrs=self.namesrv, trace_enabled=False, tls=self.pki is not None,
                            tls_ca_file=None if self.pki is None else self.pki.ca_file)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            proc.wait(30)


def bench_tls_overhead(quick: bool) -> None:
    """``security.tls_overhead``: produce rate over TLS over plaintext, alternating rounds in one run."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' certificate maker
    from tls_certs import make_pki  # noqa: PLC0415

    rounds, seconds = (2, 2.0) if quick else (5, 4.0)
    with tempfile.TemporaryDirectory(prefix="sparkmq-bench-tls-") as tmp:
        plain = TlsService(Path(tmp) / "plain", None)
        try:
            tls = TlsService(Path(tmp) / "tls", make_pki(Path(tmp) / "pki"))
            try:
                rates: dict[bool, list[float]] = {True: [], False: []}
                cpus: dict[bool, list[float]] = {True: [], False: []}
                for i in range(rounds):
                    for on in ((True, False) if i % 2 else (False, True)):  # ABBA: no order bias
                        rate, cpu_us = produce_rate(tls if on else plain, seconds)  # type: ignore[arg-type]
                        rates[on].append(rate)
                        cpus[on].append(cpu_us)
            finally:
                tls.stop()
        finally:
            plain.stop()
    tls_rate, plain_rate = statistics.median(rates[True]), statistics.median(rates[False])
    tls_cpu, plain_cpu = statistics.median(cpus[True]), statistics.median(cpus[False])
    line("security.tls_overhead", ratio=tls_rate / plain_rate, tls_msgs_per_s=tls_rate, plain_msgs_per_s=plain_rate,
         cpu_ratio=plain_cpu / tls_cpu, tls_cpu_us_per_msg=tls_cpu, plain_cpu_us_per_msg=plain_cpu, rounds=rounds,
         target=0.7)


#: name -> the function printing its line (default: all, in this order).
BENCHES: dict[str, Callable[[bool], None]] = {"acl_overhead": bench_acl_overhead, "tls_overhead": bench_tls_overhead}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test of the figures)")
    parser.add_argument("--only", help=f"comma-separated names of {sorted(BENCHES)}")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",")] if args.only else list(BENCHES)
    unknown = sorted(set(names) - set(BENCHES))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {sorted(BENCHES)}")
    for name in names:
        BENCHES[name](args.quick)


if __name__ == "__main__":
    main()
