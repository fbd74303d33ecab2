"""Run the console: ``python -m sparkmq.api.console.main --namesrv 127.0.0.1:9876 --port 8082``.

Prints ``console listening on http://HOST:PORT`` once it accepts connections (also with ``--port 0``);
SIGTERM or Ctrl-C stops it.  ``sparkmq console`` runs this; ``sparkmq dev`` runs a :class:`ConsoleThread`.
"""
from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable, Sequence

from ...platform.client.admin import AdminClient
from ...platform.client.config import ClientConfig
from ..serving import Server, announcer, bind_socket, run_service, serve_app
from .app import create_app

__all__ = ["main", "serve", "ConsoleThread", "DEFAULT_PORT"]

#: The console's port unless told otherwise.
DEFAULT_PORT = 8082
_ANNOUNCE = announcer("console")


async def serve(namesrv: str, host: str, port: int, *, on_ready: Callable[[str, int], None] = _ANNOUNCE,
                handle_signals: bool = True, server_ready: Callable[[Server], None] | None = None,
                log_level: str = "warning") -> bool:
    """Serve the console over the name servers ``namesrv`` ("host:port;host:port") until stopped."""
    sock = bind_socket(host, port)  # first: a port in use fails here, before any client is made
    app = create_app(AdminClient(ClientConfig(namesrv_addrs=namesrv)))
    return await serve_app(app, sock, on_ready, handle_signals=handle_signals, log_level=log_level,
                           server_ready=server_ready)


class ConsoleThread:
    """The console on a background thread of this process (``sparkmq dev``); :meth:`start` returns its URL."""

    def __init__(self, namesrv: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> None:
        self.namesrv, self.host, self.port = namesrv, host, port
        self.url = ""
        self._server: Server | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> str:
        """Start serving; returns ``http://HOST:PORT`` once connections are accepted (raises what stopped it)."""
        def ready(host: str, port: int) -> None:
            self.url = f"http://{host}:{port}"
            self._ready.set()

        def run() -> None:
            try:
                run_service(serve(self.namesrv, self.host, self.port, on_ready=ready, handle_signals=False,
                                  server_ready=lambda s: setattr(self, "_server", s)))
            except BaseException as exc:  # reported by start()
                self._error = exc
            finally:
                self._ready.set()

        self._thread = threading.Thread(target=run, name="console", daemon=True)
        self._thread.start()
        self._ready.wait(timeout)
        if self._error is not None:
            raise self._error
        if not self.url:
            raise TimeoutError(f"the console did not start within {timeout} s")
        return self.url

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and serve; the exit status (2 for bad arguments, 1 when it cannot listen)."""
    parser = argparse.ArgumentParser(prog="sparkmq console", description=__doc__.splitlines()[0])
    parser.add_argument("--namesrv", default="127.0.0.1:9876",
                        help='name servers, "host:port;host:port" (default %(default)s)')
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port, 0 = any free one (default %(default)s)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    try:
        ClientConfig(namesrv_addrs=args.namesrv)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        started = run_service(serve(args.namesrv, args.host, args.port, log_level=args.log_level))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"console: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0 if started else 1


if __name__ == "__main__":
    sys.exit(main())
