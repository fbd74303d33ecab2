"""The web console (issue 15): one place to see and act on a whole cluster, in a browser.

* :func:`~sparkmq.api.console.app.create_app`: the page and its JSON API over
  :class:`~sparkmq.platform.client.admin.AdminClient` (the same admin logic as ``sparkmq admin``).
* :mod:`~sparkmq.api.console.main`: ``sparkmq console --namesrv ADDR``; ``sparkmq dev`` serves it too
  (:class:`~sparkmq.api.console.main.ConsoleThread`).
* :func:`~sparkmq.api.console.docs.install_docs`: every service's ``/docs`` from bundled Swagger UI.

The page's JavaScript (uPlot for the charts, Swagger UI for ``/docs``) is bundled at build time by
``python3 build.py setup`` into ``static/vendor``: nothing is loaded from a CDN.
"""
from __future__ import annotations

__all__: list[str] = []
