"""Run one stateless gateway: ``python -m sparkmq.api.gateway_main --namesrv 127.0.0.1:9876 --port 8080``.

Prints ``gateway listening on http://HOST:PORT`` once it accepts connections;
SIGTERM or Ctrl-C stops it (queued sends finish first).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ..platform.client.config import ClientConfig
from ..platform.client.producer import Producer
from ..platform.common.tls import TlsSettings
from .gateway_app import GATEWAY_PRODUCER_GROUP, create_app
from .serving import announcer, bind_socket, run_service, serve_app

__all__ = ["main", "serve", "DEFAULT_PORT"]

#: The gateway's default HTTP port.
DEFAULT_PORT = 8080
_ANNOUNCE = announcer("gateway")


async def serve(namesrv_addrs: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
                group: str = GATEWAY_PRODUCER_GROUP, log_level: str = "warning",
                on_ready: Callable[[str, int], None] = _ANNOUNCE, tls: TlsSettings | None = None,
                **client_settings: object) -> bool:
    """Serve a gateway routing over ``namesrv_addrs`` until stopped; returns whether it started.

    ``tls``: serve HTTPS with its certificate, and reach the cluster over TLS when it connects (its CA)."""
    if tls is not None and tls.connects:
        client_settings = {"tls": True, "tls_ca_file": tls.ca_file, **client_settings}
    if tls is not None and tls.enabled and on_ready is _ANNOUNCE:
        on_ready = announcer("gateway", "https")  # the ready line names the real scheme
    config = ClientConfig(namesrv_addrs=namesrv_addrs, **client_settings)  # type: ignore[arg-type]
    app = create_app(Producer(group, config))
    return await serve_app(app, bind_socket(host, port), on_ready, log_level=log_level, tls=tls)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and serve; returns the exit status (2 for bad arguments, 1 if it could not start)."""
    parser = argparse.ArgumentParser(prog="python -m sparkmq.api.gateway_main", description=__doc__.splitlines()[0])
    parser.add_argument("--namesrv", required=True, help='name servers, "host:port;host:port"')
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port, 0 = any free one (default %(default)s)")
    parser.add_argument("--group", default=GATEWAY_PRODUCER_GROUP, help="producer group of the gateway's sends")
    parser.add_argument("--send-timeout-s", type=float, default=None, help="bound on one send with its retries")
    parser.add_argument("--tls-cert-file", help="PEM certificate chain: serve HTTPS only (docs/security-tls.md)")
    parser.add_argument("--tls-key-file", help="PEM private key of --tls-cert-file")
    parser.add_argument("--tls-ca-file", help="PEM CAs trusted for the cluster's servers (default: the system's)")
    parser.add_argument("--tls-connect", action=argparse.BooleanOptionalAction, default=None,
                        help="reach name servers and brokers over TLS (default: when serving TLS)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    settings = {} if args.send_timeout_s is None else {"send_timeout_s": args.send_timeout_s}
    try:
        tls = TlsSettings(args.tls_cert_file, args.tls_key_file, args.tls_ca_file, connect=args.tls_connect)
        started = run_service(serve(args.namesrv, args.host, args.port, group=args.group, log_level=args.log_level,
                                    tls=tls, **settings))
    except KeyboardInterrupt:
        return 0
    except ValueError as exc:
        parser.error(str(exc))
    except OSError as exc:
        print(f"gateway: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0 if started else 1


if __name__ == "__main__":
    sys.exit(main())
