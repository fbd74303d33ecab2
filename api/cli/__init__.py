"""The ``sparkmq`` command line.

``sparkmq dev`` runs the embedded default; ``sparkmq namesrv`` / ``broker`` /
``gateway`` run one service each; ``sparkmq admin …`` manages topics, groups and
the cluster; ``sparkmq produce`` / ``consume`` send and receive; ``sparkmq console``
serves the web console; ``sparkmq store …`` works on a store directory.  Tables for people, ``--json`` for scripts.
"""
from __future__ import annotations

import importlib

import click

__all__ = ["main"]

#: Each command and the module (in this package) that defines it.  A command's module is imported only when that
#: command runs: ``sparkmq admin topics`` need not import the broker, the console and Spark's helpers (seconds of
#: CPU for every short command a script runs).
COMMANDS = {
    "admin": "admin_cmd", "produce": "admin_cmd", "consume": "admin_cmd",
    "namesrv": "services", "broker": "services", "gateway": "services", "dev": "services",
    "console": "console_cmd", "lake": "lake_cmd", "sql": "lake_cmd", "store": "store_cmd",
}


class _LazyGroup(click.Group):
    """A group whose commands are imported when they are looked up (:data:`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module = importlib.import_module(f".{COMMANDS[cmd_name]}", __name__)
            self.add_command(getattr(module, cmd_name), cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=_LazyGroup)
@click.version_option(package_name="sparkmq")
def main() -> None:
    """sparkmq: a RocketMQ-style message platform on Spark."""
