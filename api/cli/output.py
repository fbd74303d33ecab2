"""How the CLI prints: rich tables for people, JSON (``--json``) for scripts."""
from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ...platform.common.errors import SparkMQError

__all__ = ["console", "emit", "emit_rows", "fail"]

console = Console()


def emit(data: Any, as_json: bool, render: Any = None) -> None:
    """Print ``data`` as JSON, or call ``render(data)`` (default: pretty-print) for people."""
    if as_json:
        click.echo(json.dumps(data, default=str))
    elif render is not None:
        render(data)
    else:
        console.print(data)


def emit_rows(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], as_json: bool,
              title: str | None = None) -> None:
    """Print rows as a table with ``columns`` (or as a JSON list)."""
    if as_json:
        click.echo(json.dumps(list(rows), default=str))
        return
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    console.print(table)


def fail(exc: SparkMQError, as_json: bool = False) -> None:
    """Report a stable error and exit 1 (JSON ``{"code","message"}`` on stdout with ``--json``)."""
    if as_json:
        click.echo(json.dumps(exc.to_dict()))
    else:
        Console(stderr=True).print(f"[red]{exc.code.name}[/]: {exc.message}")
    sys.exit(1)
