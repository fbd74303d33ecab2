"""The ``sparkmq`` command line.

``sparkmq dev`` runs the embedded default; ``sparkmq store …`` works on a store
directory.  Tables for people, ``--json`` for scripts.
"""
from __future__ import annotations

import time
import tomllib
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ...platform.common.message import Message
from ...platform.store import FlushMode, GetStatus, MessageStore, StoreConfig

console = Console()


@click.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("var/dev"), show_default=True,
              help="where the embedded platform keeps its files")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="a TOML file with a [store] table (see conf/single-node.toml)")
@click.option("--messages", default=10_000, show_default=True, help="how many demo messages to send")
def dev(data_dir: Path, config_file: Path | None, messages: int) -> None:
    """Start the embedded platform on this machine and run the send/receive demo."""
    store_dir = data_dir / "store"
    settings = {"segment_size": 64 << 20, "flush_mode": FlushMode.ASYNC_FLUSH}
    if config_file is not None:
        settings.update(tomllib.loads(config_file.read_text()).get("store", {}))
    if config_file is None or "root" not in settings:
        settings["root"] = store_dir
    cfg = StoreConfig.from_mapping(settings)
    store_dir = cfg.root
    with MessageStore(cfg) as store:
        console.print(f"store open at [bold]{store_dir}[/] (clean start: {store.clean_start}, "
                      f"recovered to offset {store.recovery.get('end_offset')})")
        started = time.perf_counter()
        batch = [Message("DemoTopic", b"hello sparkmq %d" % i, tags="demo", keys=(f"k{i}",)) for i in range(64)]
        sent = 0
        first = {}
        while sent < messages:
            n = min(64, messages - sent)
            results = store.put_batch("DemoTopic", sent // 64 % 4, batch[:n])
            first.setdefault(results[0].queue_id, results[0].queue_offset)
            sent += n
        elapsed = time.perf_counter() - started
        console.print(f"sent {sent} messages in {elapsed * 1000:.0f} ms ({sent / elapsed:,.0f} msg/s)")
        table = Table("queue", "from offset", "received", "max offset", title="DemoTopic")
        received_total = 0
        for qid in range(4):
            offset = first.get(qid, store.max_offset("DemoTopic", qid))
            received = 0
            while True:
                got = store.get_messages("DemoTopic", qid, offset, 256, tags={"demo"})
                if got.status is not GetStatus.FOUND:
                    break
                received += len(got.messages)
                offset = got.next_offset
            received_total += received
            table.add_row(str(qid), str(first.get(qid, "-")), str(received), str(store.max_offset("DemoTopic", qid)))
        console.print(table)
        console.print(f"received {received_total} of {sent}; flushed to offset {store.flush()}")
        if received_total != sent:
            raise SystemExit(1)


