"""The repository layout promises and the command-line entry points."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections import Counter
from enum import Enum, EnumType
from pathlib import Path

import pytest

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
    """Why ``codes`` is not a set of distinct, stable error codes ([] when it is).

    Iterating an Enum skips aliases (a member whose value equals an earlier one's becomes that member
    under a second name), so every check walks ``__members__``, which lists them.
    """
    members = codes.__members__
    problems = [f"{name} is an alias of {member.name} (same value {member.value!r})"
                for name, member in members.items() if member.name != name]
    if len(members) != len(list(codes)):
        problems.append(f"{len(members)} names but {len(list(codes))} distinct codes")
    by_number = Counter(member.remoting_code for member in members.values())
    problems += [f"remoting number {n} is used by {[name for name, m in members.items() if m.remoting_code == n]}"
                 for n, count in by_number.items() if count > 1]
    for name, member in members.items():
        if not (isinstance(member.remoting_code, int) and member.remoting_code > 0):
            problems.append(f"{name}: remoting number {member.remoting_code!r} is not a positive integer")
        if not (400 <= member.http_status < 600 and member.description):
            problems.append(f"{name}: HTTP status {member.http_status} or description {member.description!r}")
        back = codes.from_remoting_code(member.remoting_code)
        if back is None or back.name != name:
            problems.append(f"from_remoting_code({member.remoting_code}) gives {back}, not {name}")
    if codes.from_remoting_code(max(by_number, default=0) + 1) is not None:
        problems.append("an unknown remoting number maps to a code")
    return problems


def test_error_codes_are_distinct_and_map_to_remoting_numbers_and_http_statuses_once():
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


def test_the_error_code_check_catches_aliases_and_shared_numbers():
    """The check above can fail: an alias (equal values) and a reused remoting number are both caught."""
    from sparkmq.platform.common.errors import ErrorCode

    assert error_code_problems(_copy_of_error_codes()) == []
    aliased = _copy_of_error_codes(TOPIC_MISSING=ErrorCode.TOPIC_NOT_EXIST.value)
    assert len({c.name for c in aliased}) == len(list(aliased))  # what the old check asserted: blind to it
    assert any("TOPIC_MISSING is an alias of TOPIC_NOT_EXIST" in p for p in error_code_problems(aliased))
    shared = _copy_of_error_codes(TEAPOT=(ErrorCode.INVALID_ARGUMENT.remoting_code, 418, "short and stout"))
    problems = error_code_problems(shared)
    assert any(f"remoting number {ErrorCode.INVALID_ARGUMENT.remoting_code} is used by" in p for p in problems)
    assert any("not INVALID_ARGUMENT" in p or "not TEAPOT" in p for p in problems)


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
    ports = {name: {config.port, config.remoting_bind_port} for name, config in configs.items()}
    dledger_ports = [p for name, used in ports.items() if name.startswith("dledger/") for p in used] + raft_ports
    assert len(dledger_ports) == len(set(dledger_ports))
    others = {p for name, used in ports.items() if not name.startswith("dledger/") for p in used}
    assert not others & set(dledger_ports)
