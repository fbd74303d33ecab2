"""build.py test's guard between phases: a process a test leaves running (its parent gone) is re-parented to the
build script, reported and stopped, so the serial phase's timings are not measured beside it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers are a Linux feature")
def test_an_orphaned_process_is_adopted_reported_and_stopped() -> None:
    script = textwrap.dedent(f"""
        import json, subprocess, sys
        sys.path.insert(0, {str(ROOT)!r})
        import build
        build.adopt_orphans()
        # A shell that starts a long sleep in the background and exits: the sleep is orphaned.
        out = subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True).stdout
        orphan = int(out.strip())
        # One that exits within the grace time is not reported.
        subprocess.run(["sh", "-c", "sleep 0.3 >/dev/null 2>&1 &"])
        stopped = build.stop_leftovers(grace_s=1.0)
        print(json.dumps({{"orphan": orphan, "stopped": stopped, "left": list(build._children())}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert [line.rsplit(", for ", 1)[0] for line in report["stopped"]] == [f"{report['orphan']} sleep 300 (in {ROOT}"]
    assert report["left"] == []
    assert not os.path.exists(f"/proc/{report['orphan']}")
