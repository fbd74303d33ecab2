"""Configuration of one name server, validated once at construction."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..common.tls import TlsSettings

__all__ = ["NameServerConfig", "DEFAULT_PORT", "DEFAULT_SCAN_INTERVAL_S", "DEFAULT_BROKER_EXPIRY_S"]

#: RocketMQ's name server port.
DEFAULT_PORT = 9876
#: RocketMQ scans for silent brokers every 5 s ...
DEFAULT_SCAN_INTERVAL_S = 5.0
#: ... and drops a broker that has not registered for 120 s (brokers register every 30 s).
DEFAULT_BROKER_EXPIRY_S = 120.0


def _positive_seconds(name: str, value: object) -> None:
    # bool is an int subclass; True seconds is a bug, not a duration.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")


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
    port: int = DEFAULT_PORT
    #: How often silent brokers are looked for.
    scan_interval_s: float = DEFAULT_SCAN_INTERVAL_S
    #: A broker address silent for longer than this is removed with everything it served.
    broker_expiry_s: float = DEFAULT_BROKER_EXPIRY_S
    #: TLS (docs/security-tls.md): PEM certificate chain and key the HTTP port serves with; unset = plaintext.
    #: A name server only listens (HTTP), and an HTTP port with a certificate serves TLS only.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host.strip():
            raise ValueError(f"host must be a non-empty string, got {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an integer in 0..65535, got {self.port!r}")
        _positive_seconds("scan_interval_s", self.scan_interval_s)
        _positive_seconds("broker_expiry_s", self.broker_expiry_s)
        for name in ("tls_cert_file", "tls_key_file"):
            if isinstance(getattr(self, name), Path):
                object.__setattr__(self, name, str(getattr(self, name)))
        object.__setattr__(self, "_tls", TlsSettings(self.tls_cert_file, self.tls_key_file))  # validates now

    @property
    def tls(self) -> TlsSettings:
        """The TLS settings of the HTTP port."""
        return self._tls  # type: ignore[attr-defined, no-any-return]  # set in __post_init__
