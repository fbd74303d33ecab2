"""``sparkmq store …``: work on a store directory without a broker."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import click
from rich.table import Table

from ...platform.store import verify_store
from .output import console

__all__ = ["store"]


@click.group()
def store() -> None:
    """Work on a store directory."""


@store.command("verify")
@click.argument("root", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.option("--no-queues", is_flag=True, help="skip the consume-queue check")
def store_verify(root: Path, as_json: bool, no_queues: bool) -> None:
    """Check every record's CRC and every queue unit; exit 1 on damage."""
    report = verify_store(root, check_queues=not no_queues)
    if as_json:
        click.echo(json.dumps({**asdict(report), "ok": report.ok}))
    else:
        console.print(f"segments={report.segments} records_ok={report.records_ok} end_offset={report.end_offset} "
                      f"queue_units={report.queue_units_checked}")
        if report.problems:
            table = Table("where", "offset", "problem", title="damage found")
            for p in report.problems:
                table.add_row(p.where, str(p.offset), p.reason)
            console.print(table)
        else:
            console.print("[green]no damage found[/]")
    sys.exit(0 if report.ok else 1)
