"""Configuration of one name server, validated once at construction."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..auth.model import check_service_acl_settings
from ..common.tls import TlsSettings
from ..common.validation import Port, Seconds, check_fields

__all__ = ["NameServerConfig", "DEFAULT_PORT", "DEFAULT_SCAN_INTERVAL_S", "DEFAULT_BROKER_EXPIRY_S"]

#: RocketMQ's name server port.
DEFAULT_PORT = 9876
#: RocketMQ scans for silent brokers every 5 s ...
DEFAULT_SCAN_INTERVAL_S = 5.0
#: ... and drops a broker that has not registered for 120 s (brokers register every 30 s).
DEFAULT_BROKER_EXPIRY_S = 120.0


@dataclass(frozen=True)
class NameServerConfig:
    """Settings of one name server node.

    Example::

        >>> NameServerConfig(port=0, broker_expiry_s=2.0, scan_interval_s=0.5).port
        0
    """

    #: Interface to listen on; loopback by default so a dev run is never exposed.
    host: str = "127.0.0.1"
    #: TCP port; 0 lets the OS pick a free one (the process prints the real one).
    port: Port = DEFAULT_PORT
    #: How often silent brokers are looked for.
    scan_interval_s: Seconds = DEFAULT_SCAN_INTERVAL_S
    #: A broker address silent for longer than this is removed with everything it served.
    broker_expiry_s: Seconds = DEFAULT_BROKER_EXPIRY_S
    #: TLS (docs/security-tls.md): PEM certificate chain and key the HTTP port serves with; unset = plaintext.
    #: A name server only listens (HTTP), and an HTTP port with a certificate serves TLS only.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    #: Where the name server keeps what it must not lose: its ACL (``<data_dir>/config/acl.json``).  Routes stay
    #: in memory (brokers re-register).  Needed with ``acl_enabled``.
    data_dir: str | None = None
    #: Authentication and access control of the HTTP API (docs/security.md), as the broker's ``acl_*`` settings:
    #: every route but ``/health`` and the API docs needs a signed request whose user may do what it does.
    acl_enabled: bool = False
    #: The bootstrap super user (both keys or neither): lets an operator create the first users and policies.
    acl_super_user_access_key: str | None = None
    acl_super_user_secret_key: str | None = field(default=None, repr=False)
    #: A signed request further than this from the name server's clock is refused (seconds).
    acl_clock_skew_s: float = 300.0

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host.strip():
            raise ValueError(f"host must be a non-empty string, got {self.host!r}")
        check_fields(self)  # port, durations, acl_enabled
        for name in ("tls_cert_file", "tls_key_file"):
            if isinstance(getattr(self, name), Path):
                object.__setattr__(self, name, str(getattr(self, name)))
        object.__setattr__(self, "_tls", TlsSettings.of_files(self.tls_cert_file, self.tls_key_file))  # validates now
        if isinstance(self.data_dir, Path):
            object.__setattr__(self, "data_dir", str(self.data_dir))
        check_service_acl_settings(self.data_dir, self.acl_enabled, self.acl_super_user_access_key,
                                   self.acl_super_user_secret_key, self.acl_clock_skew_s)

    @property
    def tls(self) -> TlsSettings:
        """The TLS settings of the HTTP port."""
        return self._tls  # type: ignore[attr-defined]  # set in __post_init__
