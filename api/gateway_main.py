"""Run one stateless gateway: ``python -m sparkmq.api.gateway_main --namesrv 127.0.0.1:9876 --port 8080``.

Prints ``gateway listening on http://HOST:PORT`` once it accepts connections;
SIGTERM or Ctrl-C stops it (queued sends finish first).

``--config FILE`` reads the ``[gateway]`` table of a TOML file: :class:`GatewaySettings` (access control and the
credentials the gateway forwards with; secrets belong in a file, not on a command line).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..platform.auth import DEFAULT_CLOCK_SKEW_S, AccessGuard
from ..platform.auth.model import check_service_acl_settings
from ..platform.client.config import ClientConfig
from ..platform.client.producer import Producer
from ..platform.common.tls import TlsSettings
from .gateway_app import GATEWAY_PRODUCER_GROUP, create_app
from .serving import announcer, bind_socket, run_service, serve_app

__all__ = ["main", "serve", "DEFAULT_PORT", "GatewaySettings"]

#: The gateway's default HTTP port.
DEFAULT_PORT = 8080
_ANNOUNCE = announcer("gateway")


@dataclass(frozen=True)
class GatewaySettings:
    """The ``[gateway]`` table: who may call the gateway, and who the gateway is to the cluster.

    Example::

        >>> GatewaySettings(data_dir="var/gw", acl_enabled=True, access_key="gateway",
        ...                 secret_key="gateway-secret").acl_enabled
        True
    """

    #: Where the gateway keeps its ACL (``<data_dir>/config/acl.json``); needed with ``acl_enabled``.
    data_dir: str | None = None
    #: Callers must sign their requests, and need ``Pub`` on the topic (docs/security.md).
    acl_enabled: bool = False
    #: The bootstrap super user of the gateway's own ACL (both keys or neither).
    acl_super_user_access_key: str | None = None
    acl_super_user_secret_key: str | None = field(default=None, repr=False)
    #: A signature further than this from the gateway's clock is refused (seconds).
    acl_clock_skew_s: float = DEFAULT_CLOCK_SKEW_S
    #: The credentials the gateway signs its name-server lookups and broker sends with (both or neither).
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.data_dir, Path):
            object.__setattr__(self, "data_dir", str(self.data_dir))
        check_service_acl_settings(self.data_dir, self.acl_enabled, self.acl_super_user_access_key,
                                   self.acl_super_user_secret_key, self.acl_clock_skew_s)
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("access_key and secret_key go together: set both or neither")

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any], **overrides: Any) -> GatewaySettings:
        """From a ``[gateway]`` table, then ``overrides`` (None = keep); unknown keys are errors."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = dict(table)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown [gateway] setting(s) {unknown}; known: {sorted(known)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def guard(self) -> AccessGuard | None:
        """The gateway's access guard (None without a data dir: no ACL, no ``/acl`` API)."""
        if not self.data_dir:
            return None
        return AccessGuard.open(self.data_dir, enabled=self.acl_enabled,
                                super_user_access_key=self.acl_super_user_access_key,
                                super_user_secret_key=self.acl_super_user_secret_key,
                                clock_skew_s=self.acl_clock_skew_s)

    def client_settings(self) -> dict[str, str]:
        """The ClientConfig keys of the forwarding credentials (none when unset)."""
        if self.access_key is None or self.secret_key is None:
            return {}
        return {"access_key": self.access_key, "secret_key": self.secret_key}


async def serve(namesrv_addrs: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
                group: str = GATEWAY_PRODUCER_GROUP, log_level: str = "warning",
                on_ready: Callable[[str, int], None] = _ANNOUNCE, tls: TlsSettings | None = None,
                settings: GatewaySettings | None = None, **client_settings: object) -> bool:
    """Serve a gateway routing over ``namesrv_addrs`` until stopped; returns whether it started.

    ``tls``: serve HTTPS with its certificate, and reach the cluster over TLS when it connects (its CA).
    ``settings``: access control, and the credentials the gateway forwards with."""
    settings = settings or GatewaySettings()
    client_settings = {**settings.client_settings(), **client_settings}
    if tls is not None and tls.connects:
        client_settings = {"tls": True, "tls_ca_file": tls.ca_file, **client_settings}
    if tls is not None and tls.enabled and on_ready is _ANNOUNCE:
        on_ready = announcer("gateway", "https")  # the ready line names the real scheme
    config = ClientConfig(namesrv_addrs=namesrv_addrs, **client_settings)  # type: ignore[arg-type]
    app = create_app(Producer(group, config), settings.guard())
    return await serve_app(app, bind_socket(host, port), on_ready, log_level=log_level, tls=tls)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and serve; returns the exit status (2 for bad arguments, 1 if it could not start)."""
    parser = argparse.ArgumentParser(prog="python -m sparkmq.api.gateway_main", description=__doc__.splitlines()[0])
    parser.add_argument("--namesrv", required=True, help='name servers, "host:port;host:port"')
    parser.add_argument("--config", type=Path, default=None,
                        help="TOML file with a [gateway] table (access control: docs/security.md)")
    parser.add_argument("--data-dir", default=None, help="where the gateway's ACL is kept (config/acl.json)")
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
    # As the broker: the audit trail (sparkmq.audit, INFO for ACL changes) and warnings reach stderr.
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = {} if args.send_timeout_s is None else {"send_timeout_s": args.send_timeout_s}
    try:
        table = tomllib.loads(args.config.read_text("utf-8")).get("gateway", {}) if args.config else {}
        gateway = GatewaySettings.from_mapping(table, data_dir=args.data_dir)
    except (ValueError, TypeError, OSError, tomllib.TOMLDecodeError) as exc:
        parser.error(f"--config: {exc}")
    try:
        tls = TlsSettings(args.tls_cert_file, args.tls_key_file, args.tls_ca_file, connect=args.tls_connect)
        started = run_service(serve(args.namesrv, args.host, args.port, group=args.group, log_level=args.log_level,
                                    tls=tls, settings=gateway, **settings))
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
