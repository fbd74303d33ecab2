"""The repository layout promises and the command-line entry points."""
from __future__ import annotations

import importlib
import json
import queue
import subprocess
import sys
import threading
import time
from enum import Enum, EnumType
from pathlib import Path

import httpx
import pytest
from acl_users import ACL_SETTINGS, ALICE, WRONG, ok
from acl_users import ROOT as SUPER_USER

from procs import child_env, wait_until

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.cluster  # a child interpreter
def test_platform_folder_never_shadows_the_stdlib():
    assert not (ROOT / "platform" / "__init__.py").exists()
    probe = "import platform; print(platform.__file__); print(platform.system())"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert "site-packages" not in out[0] and not out[0].startswith(str(ROOT)) and out[1]
    for name in ("sparkmq.platform.store", "sparkmq.platform.common.errors", "sparkmq.storage_native"):
        importlib.import_module(name)


def error_code_problems(codes: type[Enum]) -> list[str]:
    """Why ``codes`` is not a set of distinct, stable error codes on RocketMQ's response codes ([] when it is).

    Several codes share one RocketMQ response code (the exact one travels in the ``errorCode`` ext field), so
    numbers may repeat; but each must be a response code RocketMQ defines, and a bare number must map back to a
    code answered with it.  Iterating an Enum skips aliases (a member whose value equals an earlier one's becomes
    that member under a second name), so every check walks ``__members__``, which lists them.
    """
    from sparkmq.platform.common.protocol import ResponseCode

    members = codes.__members__
    problems = [f"{name} is an alias of {member.name} (same value {member.value!r})"
                for name, member in members.items() if member.name != name]
    if len(members) != len(list(codes)):
        problems.append(f"{len(members)} names but {len(list(codes))} distinct codes")
    rocketmq_numbers = {int(c) for c in ResponseCode}
    for name, member in members.items():
        if member.remoting_code not in rocketmq_numbers or member.remoting_code == ResponseCode.SUCCESS:
            problems.append(f"{name}: remoting number {member.remoting_code!r} is not one of RocketMQ's error codes")
        if not (400 <= member.http_status < 600 and member.description):
            problems.append(f"{name}: HTTP status {member.http_status} or description {member.description!r}")
        back = codes.from_remoting_code(member.remoting_code)
        if back is None or back.remoting_code != member.remoting_code:
            problems.append(f"from_remoting_code({member.remoting_code}) gives {back}, not a code answered with it")
    return problems


def test_error_codes_are_distinct_and_map_to_rocketmq_response_codes_and_http_statuses():
    from sparkmq.platform.common.errors import ErrorCode

    assert error_code_problems(ErrorCode) == []


def _copy_of_error_codes(**extra: tuple[int, int, str]) -> type[Enum]:
    """ErrorCode's members (plus ``extra``) in a new Enum with the same properties and lookup."""
    from sparkmq.platform.common.errors import ErrorCode

    body = EnumType.__prepare__("Codes", (Enum,))
    for name, member in ErrorCode.__members__.items():
        body[name] = member.value
    for name, value in extra.items():
        body[name] = value
    for name in ("remoting_code", "http_status", "description"):
        body[name] = ErrorCode.__dict__[name]
    codes = EnumType("Codes", (Enum,), body)
    by_number = {code.remoting_code: code for code in codes}  # built as errors.py builds its table
    codes.from_remoting_code = classmethod(lambda cls, number: by_number.get(number))  # type: ignore[attr-defined]
    return codes


def test_the_error_code_check_catches_aliases_and_foreign_numbers():
    """The check above can fail: an alias (equal values) and a number RocketMQ has no response code for."""
    from sparkmq.platform.common.errors import ErrorCode

    assert error_code_problems(_copy_of_error_codes()) == []
    aliased = _copy_of_error_codes(TOPIC_MISSING=ErrorCode.TOPIC_NOT_EXIST.value)
    assert len({c.name for c in aliased}) == len(list(aliased))  # what a check over iteration sees: blind to it
    assert any("TOPIC_MISSING is an alias of TOPIC_NOT_EXIST" in p for p in error_code_problems(aliased))
    foreign = _copy_of_error_codes(TEAPOT=(418, 418, "short and stout"))
    problems = error_code_problems(foreign)
    assert any("TEAPOT: remoting number 418 is not one of RocketMQ's" in p for p in problems)


DEV = [sys.executable, "-m", "sparkmq.api.cli", "dev", "--namesrv-port", "0", "--broker-port", "0", "--no-lake",
       "--exit-after-demo"]


@pytest.mark.cluster
def test_dev_demo_sends_and_receives(tmp_path):
    result = subprocess.run([*DEV, "--data-dir", str(tmp_path), "--messages", "300"], capture_output=True, text=True,
                            timeout=180, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "received 300 of 300" in result.stdout
    assert "failed" not in result.stderr  # the broker unregistered before the name server stopped
    # What the demo stored is intact.
    result = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", "store", "verify", str(tmp_path / "store"),
                             "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # 300 demo messages + the warm-up, plus the trace messages recording them.
    assert report["ok"] and report["records_ok"] >= 301 and report["queue_units_checked"] == report["records_ok"]


@pytest.mark.cluster
def test_build_py_explains_missing_java(tmp_path):
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}  # no java on this PATH
    result = subprocess.run([sys.executable, str(ROOT / "build.py"), "setup"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 2
    assert "Java was not found" in result.stderr and "openjdk-17" in result.stderr


@pytest.mark.cluster
def test_dev_reads_the_tables_of_a_config_file(tmp_path):
    conf = (ROOT / "conf" / "single-node.toml").read_text()
    conf = conf.replace('data_dir = "var/dev/broker-a"', f'data_dir = "{tmp_path / "from-conf"}"')
    conf = conf.replace("segment_size = 67108864", "segment_size = 8388608")
    (tmp_path / "node.toml").write_text(conf)
    result = subprocess.run([*DEV, "--config", str(tmp_path / "node.toml"), "--messages", "100"],
                            capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    segments = list((tmp_path / "from-conf" / "store" / "commitlog").iterdir())
    assert segments and all(p.stat().st_size == 8388608 for p in segments)


def test_unknown_store_settings_are_refused():
    from sparkmq.platform.store import StoreConfig

    with pytest.raises(ValueError, match="segmnet_size"):
        StoreConfig.from_mapping({"root": "x", "segmnet_size": 4096})
    with pytest.raises(ValueError, match="segment_size must be a multiple of 4096"):
        StoreConfig.from_mapping({"root": "x", "segment_size": 5000})


def test_every_broker_file_under_conf_loads_and_the_dledger_groups_agree():
    """Each shipped broker config loads with the broker's own loader; the DLedger files form two groups of
    three whose members list the same peers, each naming itself, on ports no other file uses."""
    from sparkmq.api.broker_main import load_config

    configs = {path.relative_to(ROOT / "conf").as_posix(): load_config(path)
               for path in sorted((ROOT / "conf").rglob("*.toml"))}
    assert len(configs) >= 17  # single-node, two-masters (2), 2m-2s-async (4), 2m-2s-sync (4), dledger (6)
    groups: dict[str, dict[str, object]] = {}
    for name, config in configs.items():
        if name.startswith("dledger/"):
            assert config.dledger_enabled and config.dledger_group == config.broker_name, name
            groups.setdefault(config.broker_name, {})[config.dledger_self_id] = config
    assert sorted(groups) == ["broker-a", "broker-b"]
    raft_ports = []
    for broker_name, members in groups.items():
        assert sorted(members) == ["n0", "n1", "n2"], broker_name
        peers = {m.dledger_peers for m in members.values()}
        assert len(peers) == 1, f"{broker_name}: the members disagree on dledger_peers: {peers}"
        parsed = next(iter(members.values())).dledger_members()
        assert sorted(parsed) == ["n0", "n1", "n2"]
        raft_ports += [port for _host, port in parsed.values()]
        assert len({m.store["segment_size"] for m in members.values()}) == 1
    for member in ("n0", "n1", "n2"):
        assert configs[f"dledger/broker-{member}.toml"].broker_name == "broker-a"
        assert configs[f"dledger/broker-b-{member}.toml"].broker_name == "broker-b"
    # No two DLedger brokers share a port (HTTP, remoting, Raft), and no other file uses one of theirs.
    ports = {name: {config.port, config.remoting_bind_port} - {None} for name, config in configs.items()}
    dledger_ports = [p for name, used in ports.items() if name.startswith("dledger/") for p in used] + raft_ports
    assert len(dledger_ports) == len(set(dledger_ports))
    others = {p for name, used in ports.items() if not name.startswith("dledger/") for p in used}
    assert not others & set(dledger_ports)


def test_dev_keeps_access_control_off_unless_the_broker_table_turns_it_on(tmp_path):
    """The embedded default stays open (no ACL anywhere); ``[broker] acl_enabled`` turns it on for the embedded name
    server too (same super user, its ACL beside the broker's files) and the lake signs as that user."""
    from sparkmq.api.embedded import EmbeddedPlatform

    for default in (EmbeddedPlatform.from_toml(None, data_dir=tmp_path / "a", lake=True),
                    EmbeddedPlatform.from_toml(ROOT / "conf" / "single-node.toml", data_dir=tmp_path / "b")):
        assert not default.acl_enabled and not default.namesrv_config.acl_enabled
        assert default.lake_settings.credentials is None
    (tmp_path / "acl.toml").write_text(_acl_table())
    acl = EmbeddedPlatform.from_toml(tmp_path / "acl.toml", data_dir=tmp_path / "c", lake=True)
    ns = acl.namesrv_config
    assert acl.acl_enabled and ns.acl_enabled and ns.data_dir == str(tmp_path / "c" / "namesrv")
    assert (ns.acl_super_user_access_key, ns.acl_super_user_secret_key, ns.acl_clock_skew_s) == \
        (SUPER_USER.access_key, SUPER_USER.secret_key, 60.0)
    assert acl.credentials == SUPER_USER and acl.lake_settings.credentials == SUPER_USER
    assert SUPER_USER.secret_key not in repr(ns) + repr(acl.lake_settings)
    # Without a bootstrap super user nobody could sign anything: refused up front, the message naming the keys.
    (tmp_path / "nobody.toml").write_text("[broker]\nacl_enabled = true\n")
    with pytest.raises(ValueError, match="acl_super_user_access_key"):
        EmbeddedPlatform.from_toml(tmp_path / "nobody.toml", data_dir=tmp_path / "d")


def _acl_table(**more: object) -> str:
    """A ``[broker]`` table with the ACL tests' settings (tests/acl_users.py) and ``more``."""
    return "[broker]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in {**ACL_SETTINGS, **more}.items())


def _dev_lines(proc: subprocess.Popen[str], until: str, timeout: float) -> list[str]:
    """The lines ``sparkmq dev`` printed up to the one containing ``until`` (AssertionError after ``timeout``)."""
    lines: queue.Queue[str] = queue.Queue()
    out = proc.stdout
    assert out is not None
    threading.Thread(target=lambda: [lines.put(line) for line in out], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while not seen or until not in seen[-1]:
        try:
            seen.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            raise AssertionError(f"sparkmq dev printed no {until!r} in {timeout} s: {seen}") from None
    return seen


@pytest.mark.cluster
def test_dev_with_acl_on_refuses_unsigned_calls_to_every_embedded_service(procs, tmp_path):
    """``sparkmq dev --config`` with ``[broker] acl_enabled``: the demo runs signed; the name server, the broker and
    its gateway endpoints refuse unsigned and wrongly signed calls (changing nothing) and serve signed ones."""
    from sparkmq.platform.client.remoting import SigningAuth

    conf = tmp_path / "dev-acl.toml"
    conf.write_text(_acl_table(data_dir=str(tmp_path / "dev"), trace_enabled=False, register_interval_s=0.5)
                    + "[store]\nsegment_size = 8388608\n")
    argv = [sys.executable, "-m", "sparkmq.api.cli", "dev", "--config", str(conf), "--namesrv-port", "0",
            "--broker-port", "0", "--no-lake", "--console-port", "-1", "--messages", "20"]
    dev = procs.spawn("dev", argv, stdout=subprocess.PIPE, env=child_env(COLUMNS="500"))
    printed = _dev_lines(dev.proc, "serving; Ctrl-C stops", 120)
    assert "received 20 of 20" in "".join(printed), printed  # the demo signs as the bootstrap super user
    where = next(line for line in printed if line.startswith("name server on"))
    namesrv, broker = (part.split(",")[0].split()[0] for part in where.split(" on http://")[1:3])
    admin_calls = {  # (service, method, path, JSON body) -> what it must not change when refused
        "name server: cluster view": (namesrv, "GET", "/cluster", None),
        "name server: forget a topic": (namesrv, "DELETE", "/topics/DemoTopic", None),
        "broker: state": (broker, "GET", "/broker", None),
        "broker: create a topic": (broker, "POST", "/topics", {"topic": "made-unsigned", "read_queue_nums": 1,
                                                               "write_queue_nums": 1}),
        "gateway: send": (broker, "POST", "/topics/DemoTopic/messages", {"body": "unsigned"}),
    }

    def call(credentials, addr: str, method: str, path: str, body) -> httpx.Response:
        with httpx.Client(base_url=f"http://{addr}", timeout=10,
                          auth=SigningAuth(credentials) if credentials else None) as http:
            return http.request(method, path, json=body)

    def state() -> dict:
        with httpx.Client(timeout=10, auth=SigningAuth(SUPER_USER)) as http:
            return {"route": http.get(f"http://{namesrv}/routes/DemoTopic").json(),
                    "topics": ok(http.get(f"http://{namesrv}/topics"))["topics"],
                    "max_offset": ok(http.get(f"http://{broker}/broker"))["commitlog"]["max_offset"],
                    "broker_topics": sorted(t["topic"] for t in ok(http.get(f"http://{broker}/topics"))["topics"])}

    # The demo's topic was auto-created: the name server routes it from the broker's next (signed) registration.
    wait_until(lambda: call(SUPER_USER, namesrv, "GET", "/routes/DemoTopic", None).status_code == 200, 20,
               "the broker's signed registration of DemoTopic")
    before = state()
    for what, (addr, method, path, body) in admin_calls.items():
        for credentials in (None, WRONG, ALICE):  # no keys, a wrong secret, a user no service knows
            resp = call(credentials, addr, method, path, body)
            assert (resp.status_code, resp.json().get("code")) == (401, "AUTHENTICATION_FAILED"), f"{what}: {resp.text}"
    assert state() == before, "a refused call changed something"
    with httpx.Client(timeout=10) as http:
        assert http.get(f"http://{namesrv}/health").status_code == 200, "health checks stay open"
    # Signed by the config's bootstrap super user, the same calls go through (the topic is forgotten last).
    for what in ("name server: cluster view", "broker: state", "broker: create a topic", "gateway: send",
                 "name server: forget a topic"):
        assert call(SUPER_USER, *admin_calls[what]).status_code == 200, what
    after = state()
    assert after["max_offset"] > before["max_offset"] and "made-unsigned" in after["broker_topics"]
    assert after["route"]["code"] == "TOPIC_NOT_EXIST" and "DemoTopic" not in after["topics"]
    assert dev.stop(timeout=60) == 0, dev.log()[-3000:]
    assert SUPER_USER.secret_key not in "".join(printed) + dev.log(), "the secret is never printed or logged"


class _Started(Exception):
    """Raised by the fake lake service: the command got as far as starting it."""


def test_lake_runs_the_jobs_named_by_job_options(monkeypatch):
    """``sparkmq lake --job J`` (repeatable) runs only those jobs, each once; without it every job runs; an unknown
    job is a usage error that lists the known ones, and nothing starts."""
    import signal

    from click.testing import CliRunner

    import sparkmq.pipelines.lake_service as lake_service
    from sparkmq.api.cli import main

    started: list[tuple[str, ...]] = []

    class FakeLake:
        def __init__(self, *_roots: object, jobs: tuple[str, ...], **_settings: object) -> None:
            started.append(jobs)

        def start(self, background: bool) -> None:
            raise _Started

    monkeypatch.setattr(lake_service, "LakeService", FakeLake)
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # the command's handlers must not outlive the test
    runner = CliRunner()
    lake = ["lake", "--namesrv", "127.0.0.1:1"]
    for args, expected in [([], lake_service.LAKE_JOBS), (["--job", "dispatch"], ("dispatch",)),
                           (["--job", "trace", "--job", "dispatch", "--job", "trace"], ("trace", "dispatch"))]:
        started.clear()
        result = runner.invoke(main, lake + args)
        assert isinstance(result.exception, _Started) and started == [expected], (args, result.output)
    started.clear()
    result = runner.invoke(main, lake + ["--job", "index"])
    assert result.exit_code == 2 and "'index' is not one of 'dispatch', 'trace', 'dlq', 'reports', 'maintenance'" \
        in result.output, result.output
    assert started == []


def test_lake_and_admin_sign_with_keys_from_options_or_the_environment(monkeypatch):
    """``sparkmq lake`` hands ``--access-key`` / ``--secret-key`` (or SPARKMQ_ACCESS_KEY / SPARKMQ_SECRET_KEY, as
    ``sparkmq admin``) to the lake jobs; one without the other, or a bad one, is a usage error that never echoes
    the secret."""
    import signal

    from click.testing import CliRunner

    import sparkmq.pipelines.lake_service as lake_service
    from sparkmq.api.cli import admin_cmd, main
    from sparkmq.platform.auth import Credentials

    seen: list[object] = []

    class FakeLake:
        def __init__(self, *_roots: object, credentials: Credentials | None = None, **_settings: object) -> None:
            seen.append(credentials)

        def start(self, background: bool) -> None:
            raise _Started

    class FakeAdmin:
        def __init__(self, config: object) -> None:
            seen.append(config.credentials)  # type: ignore[attr-defined]

        def topic_list(self) -> list[str]:
            return []

        def close(self) -> None:
            pass

    monkeypatch.setattr(lake_service, "LakeService", FakeLake)
    monkeypatch.setattr(admin_cmd, "AdminClient", FakeAdmin)
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # the command's handlers must not outlive the test
    lake_user = Credentials("lake", "lake-secret-1")
    no_env = {"SPARKMQ_ACCESS_KEY": None, "SPARKMQ_SECRET_KEY": None}
    from_env = {"SPARKMQ_ACCESS_KEY": lake_user.access_key, "SPARKMQ_SECRET_KEY": lake_user.secret_key}
    runner = CliRunner()
    lake = ["lake", "--namesrv", "127.0.0.1:1"]
    keys = ["--access-key", lake_user.access_key, "--secret-key", lake_user.secret_key]
    for args, env, expected in [(lake + keys, no_env, lake_user), (lake, from_env, lake_user), (lake, no_env, None),
                                (["admin", *keys[:2], "topic", "list"], {"SPARKMQ_SECRET_KEY": lake_user.secret_key},
                                 lake_user), (["admin", "topic", "list"], no_env, None)]:
        seen.clear()
        result = runner.invoke(main, args, env=env)
        assert seen == [expected], (args, result.output, result.exception)
    for args, complaint in [(lake + keys[:2], "--secret-key is missing"), (lake + keys[2:], "--access-key is missing"),
                            (lake + ["--access-key", "lake", "--secret-key", "short"], "secret key must be"),
                            (["admin", "--secret-key", "lake-secret-1", "topic", "list"], "--access-key is missing")]:
        result = runner.invoke(main, args, env=no_env)
        assert result.exit_code == 2 and complaint in result.output, (args, result.output)
        assert "lake-secret-1" not in result.output and "'short'" not in result.output


def test_every_command_is_found_by_its_name_and_a_short_command_imports_only_what_it_uses():
    """The ``sparkmq`` group lists every command and imports each one's module when it runs: ``sparkmq admin``
    and ``produce`` never import the broker, and the name server does not either (importing it costs seconds of
    CPU at every start, paid by every line of a script and every test that starts one)."""
    import click

    from sparkmq.api import cli

    ctx = cli.main.make_context("sparkmq", ["--help"], resilient_parsing=True)
    names = cli.main.list_commands(ctx)
    assert names == sorted(cli.COMMANDS)
    for name in names:
        command = cli.main.get_command(ctx, name)
        assert isinstance(command, click.Command) and command.name == name
    assert cli.main.get_command(ctx, "no-such-command") is None

    broker = "sparkmq.platform.broker.broker"
    script = ("import sys, runpy\n"
              "sys.argv = ['sparkmq', *sys.argv[1:]]\n"
              "try:\n    runpy.run_module('sparkmq.api.cli', run_name='__main__')\n"
              "except SystemExit:\n    pass\n"
              f"print({broker!r} in sys.modules)\n")
    for args in (["admin", "--help"], ["produce", "--help"], ["store", "--help"]):
        done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120,
                              env=child_env())
        assert done.returncode == 0 and done.stdout.strip().endswith("False"), (args, done.stdout, done.stderr)
    done = subprocess.run([sys.executable, "-c", "import sys, sparkmq.api.namesrv_main\n"
                           f"print({broker!r} in sys.modules)"], capture_output=True, text=True, timeout=120,
                          env=child_env())
    assert done.stdout.strip() == "False", done.stderr
