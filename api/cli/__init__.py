"""The ``sparkmq`` command line.

``sparkmq dev`` runs the embedded default; ``sparkmq namesrv`` / ``broker`` /
``gateway`` run one service each; ``sparkmq admin …`` manages topics, groups and
the cluster; ``sparkmq produce`` / ``consume`` send and receive; ``sparkmq console``
serves the web console; ``sparkmq store …`` works on a store directory.  Tables for people, ``--json`` for scripts.
"""
from __future__ import annotations

import click

from .admin_cmd import admin, consume, produce
from .console_cmd import console
from .lake_cmd import lake, sql
from .services import broker, dev, gateway, namesrv
from .store_cmd import store

__all__ = ["main"]


@click.group()
@click.version_option(package_name="sparkmq")
def main() -> None:
    """sparkmq: a RocketMQ-style message platform on Spark."""


for command in (namesrv, broker, gateway, dev, console, lake, admin, produce, consume, sql, store):
    main.add_command(command)
