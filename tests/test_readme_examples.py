"""The README's commands work as written: its ``curl`` lines, run against a real broker process."""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from procs import ProcessHarness
from sparkmq.platform.common import wire

README = Path(__file__).resolve().parent.parent / "README.md"
README_PORT = "10911"  # where the README's broker listens (``sparkmq dev``, ``sparkmq broker``)

pytestmark = pytest.mark.cluster


def readme_curl_lines() -> list[str]:
    """Every ``curl`` command in the README's bash blocks, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith("curl ")]


def test_the_readme_shows_a_send_and_a_pull() -> None:
    lines = readme_curl_lines()
    assert len(lines) == 2 and "/topics/Orders/messages" in lines[0] and "/queues/0/messages" in lines[1], lines
    assert all(f"localhost:{README_PORT}/" in line for line in lines), lines


def test_the_readmes_curl_lines_send_and_pull_a_message(procs: ProcessHarness, tmp_path: Path) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not on PATH")
    broker = procs.start("broker", "sparkmq.api.broker_main", "--data-dir", str(tmp_path / "broker"))
    send_line, pull_line = readme_curl_lines()

    def run(line: str) -> dict:
        # As written, but against this broker's port (and never waiting forever).
        argv = shlex.split(line.replace(f"localhost:{README_PORT}/", f"localhost:{broker.port}/"))
        assert argv[0] == "curl", line
        result = subprocess.run([curl, "--max-time", "30", *argv[1:]], capture_output=True, text=True, timeout=60,
                                stdin=subprocess.DEVNULL)
        assert result.returncode == 0, f"{line}\n{result.stderr}"
        return json.loads(result.stdout)

    sent = run(send_line)
    assert sent.get("status") == "SEND_OK", f"{send_line}\n-> {sent}"
    pulled = run(pull_line)
    assert pulled.get("status") == "FOUND", f"{pull_line}\n-> {pulled}"
    [message] = [m for m in pulled["messages"] if m["msg_id"] == sent["msg_id"]]
    assert wire.decode_body(message["body"]) == b"hello"
    assert message["tags"] == "new" and message["keys"] == ["o-1"]
