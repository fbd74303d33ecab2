"""The repository layout promises and the command-line entry points."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_platform_folder_never_shadows_the_stdlib():
    assert not (ROOT / "platform" / "__init__.py").exists()
    probe = "import platform; print(platform.__file__); print(platform.system())"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert "site-packages" not in out[0] and not out[0].startswith(str(ROOT)) and out[1]
    for name in ("sparkmq.platform.store", "sparkmq.platform.common.errors", "sparkmq.storage_native"):
        importlib.import_module(name)


def test_error_codes_map_to_http_statuses_once():
    from sparkmq.platform.common.errors import ErrorCode

    assert len({c.name for c in ErrorCode}) == len(list(ErrorCode))
    assert all(400 <= c.http_status < 600 and c.description for c in ErrorCode)


DEV = [sys.executable, "-m", "sparkmq.api.cli", "dev", "--namesrv-port", "0", "--broker-port", "0", "--no-lake",
       "--exit-after-demo"]


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


def test_build_py_explains_missing_java(tmp_path):
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}  # no java on this PATH
    result = subprocess.run([sys.executable, str(ROOT / "build.py"), "setup"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 2
    assert "Java was not found" in result.stderr and "openjdk-17" in result.stderr


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
    import pytest

    from sparkmq.platform.store import StoreConfig

    with pytest.raises(ValueError, match="segmnet_size"):
        StoreConfig.from_mapping({"root": "x", "segmnet_size": 4096})
    with pytest.raises(ValueError, match="segment_size must be a multiple of 4096"):
        StoreConfig.from_mapping({"root": "x", "segment_size": 5000})
