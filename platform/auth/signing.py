"""Request signatures: one HMAC-SHA256 scheme for sparkmq's HTTP and remoting requests, and the verifier of
the ``MQv2-HMAC-SHA1`` header the official RocketMQ 5 gRPC clients send.

sparkmq's scheme signs what a request does and when it was made::

    part_key = HMAC-SHA256(secret_key, "SPARKMQ-PART-KEY\\n" NONCE)[:16]     # a key for this request only
    tag_i    = GMAC(part_key, iv = i, part_i)                               # AES-128-GCM, no plaintext
    mac      = HMAC-SHA256(secret_key,
                           "SPARKMQ-HMAC-SHA256\\n" METHOD "\\n" TARGET "\\n" TIMESTAMP_MS "\\n" hex(NONCE) "\\n"
                           then, per content part i: its length (8 bytes, big-endian) and tag_i (16 bytes))

NONCE is 16 random bytes the signer picks per request.  The content parts are authenticated by GMAC under a
key derived for that request alone (the Carter-Wegman construction: a one-time key makes the polynomial MAC
unforgeable), because GMAC runs at AES-NI/PCLMUL speed: a 256 KiB batch costs the client and the broker
~17 us each, where BLAKE3 cost ~55 us and SHA-256 ~145 us on this machine's cores.

* HTTP: METHOD is the HTTP method, TARGET the raw path with its query string (``/topics/t/batch?queue_id=1``),
  the one part is the body.  Headers: ``x-sparkmq-date: <epoch ms>`` and
  ``authorization: SPARKMQ-HMAC-SHA256 Credential=<access key>, Nonce=<hex nonce>, Signature=<hex mac>``.
* Remoting (RocketMQ's frames, docs/remoting.md): METHOD is ``REMOTING``, TARGET the request code in decimal,
  the parts are the frame's extFields in a canonical form (sorted by key; each key and value as a 4-byte
  big-endian length and its UTF-8) and the body.  The claim rides in the extFields as
  ``SparkMQSignature: <access key>:<timestamp ms>:<hex nonce>:<hex mac>`` (:meth:`Signer.sign_ext`).

Changing any byte of the method, path, query, header or body changes the mac; a timestamp outside the
verifier's clock-skew window is refused, so a captured request cannot be replayed later.

gRPC (the official clients): ``authorization: MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time,
Signature=<hex HMAC-SHA1(secret, x-mq-date-time)>`` with ``x-mq-date-time`` like ``20250101T120000Z``.  Only the
date is signed (the protocol's choice): the skew window bounds a replay.  The Python client writes its *local*
time with a literal ``Z``, so :func:`grpc_date_ms` accepts the value read as UTC or as the server's local time,
whichever is nearer (both the same on UTC hosts).

RocketMQ's remoting clients (Java ``AclClientRPCHook``, Go's, ``mqadmin``) add ``AccessKey`` (and ``SecurityToken``)
to the extFields, then sign: every extField's *value*, ordered by key (Java's ``TreeMap``: UTF-16 order), except
``Signature``, concatenated, UTF-8, then the body; HmacSHA1 with the secret key, Base64 => ``Signature``.  Nothing
in it says when it was made, so such a request has no replay window (RocketMQ's own choice; docs/security.md).
As RocketMQ's server does, a request of a client older than 4.9.4 (version <= 399) is checked without
``_UNIQUE_KEY_QUERY``, which those clients added after signing.
"""
from __future__ import annotations

import base64
import calendar
import hashlib
import hmac
import os
import re
import struct
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..common.errors import ErrorCode, SparkMQError
from .model import validate_access_key, validate_secret_key

__all__ = ["Credentials", "SignedRequest", "Signer", "SCHEME", "AUTHORIZATION_HEADER", "DATE_HEADER",
           "NONCE_SIZE", "GrpcSignature", "mac_of", "parse_http", "parse_grpc", "grpc_date_ms", "grpc_signature",
           "auth_failed", "EXT_SIGNATURE", "EXT_ACCESS_KEY", "EXT_ROCKETMQ_SIGNATURE", "EXT_SECURITY_TOKEN",
           "CREDENTIAL_FIELDS", "RemotingRequest", "RocketMQSignature", "canonical_ext", "rocketmq_signature",
           "rocketmq_content", "parse_remoting"]

SCHEME = "SPARKMQ-HMAC-SHA256"
#: HTTP header of the credential and signature (``SPARKMQ-HMAC-SHA256 Credential=..., Nonce=..., Signature=...``).
AUTHORIZATION_HEADER = "authorization"
#: HTTP header of the signing time, epoch milliseconds.
DATE_HEADER = "x-sparkmq-date"
#: Random bytes a signer picks per request (they make its part key).
NONCE_SIZE = 16
_PART_KEY_LABEL = b"SPARKMQ-PART-KEY\n"
_IVS = tuple(i.to_bytes(12, "big") for i in range(4))  # one GCM IV per content part (no request has more)
_LEN32 = struct.Struct(">I")

# -- remoting extFields ------------------------------------------------------------------------------------
#: The extField of sparkmq's own remoting signature: ``<access key>:<timestamp ms>:<hex nonce>:<hex mac>``.
EXT_SIGNATURE = "SparkMQSignature"
#: The extFields of RocketMQ's ``AclClientRPCHook`` (``SessionCredentials``' names).
EXT_ACCESS_KEY = "AccessKey"
EXT_ROCKETMQ_SIGNATURE = "Signature"
EXT_SECURITY_TOKEN = "SecurityToken"
#: What the guard removes from a request's extFields once it has checked them: handlers never see credentials.
CREDENTIAL_FIELDS = (EXT_SIGNATURE, EXT_ACCESS_KEY, EXT_ROCKETMQ_SIGNATURE, EXT_SECURITY_TOKEN)
#: RocketMQ's server leaves this field out of the signed content of clients up to V4_9_3 (MQVersion ordinal
#: 399): they added it after signing.
_UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
_OLD_CLIENT_VERSION = 399
_SPARKMQ_CLAIM = re.compile(
    rf"^([A-Za-z0-9_.@-]{{1,64}}):(\d{{1,18}}):([0-9a-f]{{{2 * NONCE_SIZE}}}):([0-9a-f]{{64}})$")
_LEN = struct.Struct(">Q")
_HTTP_AUTH = re.compile(rf"^{SCHEME}\s+Credential=([^,\s]*),\s*Nonce=([0-9a-fA-F]{{{2 * NONCE_SIZE}}}),"
                        r"\s*Signature=([0-9a-fA-F]{64})\s*$")
_GRPC_AUTH = re.compile(r"^MQv2-HMAC-SHA1\s+Credential=([^,]*),\s*SignedHeaders=([^,]*),"
                        r"\s*Signature=([0-9a-fA-F]*)\s*$")
_GRPC_DATE = re.compile(r"^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$")


def auth_failed(message: str) -> SparkMQError:
    """AUTHENTICATION_FAILED with ``message`` (which never names a secret)."""
    return SparkMQError(ErrorCode.AUTHENTICATION_FAILED, message)


@dataclass(frozen=True)
class Credentials:
    """An access key and its secret; ``repr`` never shows the secret.

    Example::

        >>> Credentials("alice", "s3cret-key")
        Credentials(access_key='alice')
    """

    access_key: str
    secret_key: str = field(repr=False)

    def __post_init__(self) -> None:
        validate_access_key(self.access_key)
        validate_secret_key(self.secret_key)


def mac_of(secret_key: str | bytes, method: str, target: str, timestamp_ms: int, nonce: bytes,
           parts: Sequence[bytes | bytearray | memoryview]) -> bytes:
    """The 32-byte HMAC-SHA256 of a request (see the module docstring for what is signed); ``nonce`` is the
    request's :data:`NONCE_SIZE` random bytes, at most four ``parts``."""
    if len(parts) > len(_IVS):
        raise ValueError(f"at most {len(_IVS)} content parts are signed")
    key = secret_key.encode() if isinstance(secret_key, str) else secret_key
    gmac = AESGCM(hmac.digest(key, _PART_KEY_LABEL + nonce, "sha256")[:16])
    message = [f"{SCHEME}\n{method}\n{target}\n{timestamp_ms}\n{nonce.hex()}\n".encode()]
    for iv, part in zip(_IVS, parts, strict=False):  # len(parts) <= len(_IVS), checked above
        message.append(_LEN.pack(len(part)))
        message.append(gmac.encrypt(iv, b"", part))  # no plaintext: the tag over ``part`` alone
    return hmac.digest(key, b"".join(message), "sha256")


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """What a request claims: who signed it, when, and the mac over ``method``, ``target`` and ``parts``."""

    access_key: str
    timestamp_ms: int
    nonce: bytes
    mac: bytes
    method: str
    target: str
    parts: tuple[bytes | bytearray | memoryview, ...]

    def verify(self, secret_key: str) -> bool:
        """Whether the mac is the one ``secret_key`` makes (constant-time comparison)."""
        return hmac.compare_digest(self.mac, mac_of(secret_key, self.method, self.target, self.timestamp_ms,
                                                    self.nonce, self.parts))


class Signer:
    """Signs a client's requests with its :class:`Credentials`.

    Example::

        >>> signer = Signer(Credentials("alice", "s3cret-key"), clock=lambda: 1700000000.0)
        >>> sorted(signer.http_headers("GET", "/topics", b""))
        ['authorization', 'x-sparkmq-date']
    """

    def __init__(self, credentials: Credentials, *, clock: object = time.time) -> None:
        self.credentials = credentials
        self._key = credentials.secret_key.encode()
        self._ak = credentials.access_key.encode()
        self._clock = clock

    def __repr__(self) -> str:
        return f"Signer({self.credentials!r})"

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)  # type: ignore[operator]

    def http_headers(self, method: str, target: str, body: bytes, *, timestamp_ms: int | None = None
                     ) -> dict[str, str]:
        """The two headers that sign ``method target`` with ``body`` (``target`` = raw path + ``?query``)."""
        ts = self._now_ms() if timestamp_ms is None else timestamp_ms
        nonce = os.urandom(NONCE_SIZE)
        mac = mac_of(self._key, method.upper(), target, ts, nonce, (body,))
        return {DATE_HEADER: str(ts),
                AUTHORIZATION_HEADER: f"{SCHEME} Credential={self.credentials.access_key}, Nonce={nonce.hex()}, "
                                      f"Signature={mac.hex()}"}

    def sign_ext(self, code: int, ext: Mapping[str, str] | None, body: bytes | memoryview = b"", *,
                 timestamp_ms: int | None = None) -> dict[str, str]:
        """A remoting request's extFields with sparkmq's signature added (:data:`EXT_SIGNATURE`): a new dict, so
        the caller's header stays as it was.  ``ext`` must be the exact strings the frame carries.

        Example::

            >>> signer = Signer(Credentials("alice", "s3cret-key"), clock=lambda: 1700000000.0)
            >>> signed = signer.sign_ext(310, {"b": "orders"}, b"hello")
            >>> sorted(signed), signed["SparkMQSignature"].split(":")[:2]
            (['SparkMQSignature', 'b'], ['alice', '1700000000000'])
        """
        ts = self._now_ms() if timestamp_ms is None else timestamp_ms
        nonce = os.urandom(NONCE_SIZE)
        out = dict(ext or {})
        out.pop(EXT_SIGNATURE, None)
        mac = mac_of(self._key, "REMOTING", str(code), ts, nonce, (canonical_ext(out), body))
        out[EXT_SIGNATURE] = f"{self.credentials.access_key}:{ts}:{nonce.hex()}:{mac.hex()}"
        return out


def parse_http(method: str, target: str, headers: Mapping[str, str], body: bytes) -> SignedRequest | None:
    """The signature an HTTP request carries; None when it carries none; AUTHENTICATION_FAILED when malformed."""
    auth = headers.get(AUTHORIZATION_HEADER)
    if auth is None:
        return None
    match = _HTTP_AUTH.match(auth)
    if match is None:
        raise auth_failed(f"the authorization header is not "
                          f"'{SCHEME} Credential=<access key>, Nonce=<hex>, Signature=<hex>'")
    date = headers.get(DATE_HEADER, "")
    if not date.isdigit() or len(date) > 18:
        raise auth_failed(f"the {DATE_HEADER} header must be the signing time in epoch milliseconds")
    access_key, nonce, mac = match.groups()
    return SignedRequest(access_key, int(date), bytes.fromhex(nonce), bytes.fromhex(mac), method.upper(), target,
                         (body,))


# -- remoting requests: sparkmq's signature or RocketMQ's AclClientRPCHook -----------------------------------
class RemotingRequest(Protocol):
    """What :func:`parse_remoting` reads of a request frame (``platform.remoting.Frame``)."""

    code: int
    version: int
    ext: dict[str, Any] | None
    body: bytes | memoryview


def _text(value: object) -> str:
    """An extField's value as the string its sender signed (``Frame.ext_text``: booleans as ``true``/``false``)."""
    if isinstance(value, str):
        return value
    if value is True or value is False:
        return "true" if value else "false"
    return str(value)


def canonical_ext(ext: Mapping[str, object]) -> bytes:
    """The extFields as sparkmq's remoting signature covers them (its own field left out): sorted by key, each key
    and value as a 4-byte big-endian length and the UTF-8 bytes, so no two maps share a form."""
    parts: list[bytes] = []
    for key in sorted(ext):
        if key == EXT_SIGNATURE:
            continue
        raw_key = key.encode()
        raw_value = _text(ext[key]).encode()
        parts += (_LEN32.pack(len(raw_key)), raw_key, _LEN32.pack(len(raw_value)), raw_value)
    return b"".join(parts)


def _java_order(key: str) -> bytes:
    # java.lang.String.compareTo orders by UTF-16 code units: UTF-16-BE bytes compare the same way
    return key.encode("utf-16-be", "surrogatepass")


def rocketmq_content(ext: Mapping[str, object], body: bytes | memoryview, version: int = 0) -> bytes:
    """What RocketMQ's ``AclClientRPCHook`` signs: the values of every extField but ``Signature``, ordered by key as
    Java's ``TreeMap`` orders them, concatenated, UTF-8, then the body (``_UNIQUE_KEY_QUERY`` left out for
    clients of ``version`` <= 399, as RocketMQ's server does)."""
    old = 0 < version <= _OLD_CLIENT_VERSION
    values = "".join(_text(ext[k]) for k in sorted(ext, key=_java_order)
                     if k != EXT_ROCKETMQ_SIGNATURE and not (old and k == _UNIQUE_KEY_QUERY))
    return values.encode("utf-8", "surrogatepass") + bytes(body)


def rocketmq_signature(secret_key: str, content: bytes) -> str:
    """Base64 of HmacSHA1(secret key, content): ``AclSigner.calSignature``."""
    return base64.b64encode(hmac.digest(secret_key.encode(), content, "sha1")).decode("ascii")


@dataclass(frozen=True, slots=True)
class RocketMQSignature:
    """The claim of a RocketMQ client's ``AclClientRPCHook``: an access key and the signature of ``content``."""

    access_key: str
    content: bytes
    signature: str

    def verify(self, secret_key: str) -> bool:
        """Whether ``signature`` is the one ``secret_key`` makes (constant-time comparison)."""
        return hmac.compare_digest(self.signature.encode(), rocketmq_signature(secret_key, self.content).encode())


def parse_remoting(frame: RemotingRequest) -> SignedRequest | RocketMQSignature | None:
    """The claim a remoting request carries (None: none), its credential fields removed from ``frame.ext``;
    AUTHENTICATION_FAILED when malformed.

    sparkmq's own signature (:data:`EXT_SIGNATURE`) is looked at first; else RocketMQ's ``AccessKey`` and
    ``Signature``.  The fields are removed whatever the outcome, so no handler ever sees them.
    """
    ext = frame.ext
    if not ext:
        return None
    own = ext.get(EXT_SIGNATURE)
    if own is not None:
        content = canonical_ext(ext)
        _strip(ext)
        match = _SPARKMQ_CLAIM.match(own) if isinstance(own, str) else None
        if match is None:
            raise auth_failed(f"the {EXT_SIGNATURE} field is not '<access key>:<epoch ms>:<hex nonce>:<hex mac>'")
        access_key, ts, nonce, mac = match.groups()
        return SignedRequest(access_key, int(ts), bytes.fromhex(nonce), bytes.fromhex(mac), "REMOTING",
                             str(frame.code), (content, frame.body))
    access_key = ext.get(EXT_ACCESS_KEY)
    if access_key is None:
        _strip(ext)
        return None
    signature = ext.get(EXT_ROCKETMQ_SIGNATURE)
    content = rocketmq_content(ext, frame.body, frame.version)
    _strip(ext)
    if not isinstance(access_key, str) or not access_key.strip():
        raise auth_failed("the AccessKey field is empty")
    if not isinstance(signature, str) or not signature:
        raise auth_failed("the request has an AccessKey but no Signature")
    return RocketMQSignature(access_key, content, signature)


def _strip(ext: MutableMapping[str, Any]) -> None:
    for name in CREDENTIAL_FIELDS:
        ext.pop(name, None)


@dataclass(frozen=True, slots=True)
class GrpcSignature:
    """The ``MQv2-HMAC-SHA1`` claim of a gRPC call."""

    access_key: str
    date_time: str
    signature: str

    def verify(self, secret_key: str) -> bool:
        """Whether the signature is HMAC-SHA1(secret, date time) (constant-time comparison)."""
        return hmac.compare_digest(self.signature.lower(), grpc_signature(secret_key, self.date_time))


def grpc_signature(secret_key: str, date_time: str) -> str:
    """hex HMAC-SHA1(secret, date time): what the official clients send."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def parse_grpc(metadata: Mapping[str, str]) -> GrpcSignature | None:
    """The signature of a gRPC call's metadata; None without credentials (no header, or an empty access key,
    which the Python client sends when it has none); AUTHENTICATION_FAILED when malformed."""
    auth = metadata.get("authorization")
    if auth is None:
        return None
    match = _GRPC_AUTH.match(auth)
    if match is None:
        raise auth_failed("the authorization header is not 'MQv2-HMAC-SHA1 Credential=<ak>, "
                          "SignedHeaders=x-mq-date-time, Signature=<hex>'")
    access_key, signed_headers, signature = match.groups()
    if not access_key.strip():
        return None
    if "x-mq-date-time" not in [h.strip().lower() for h in signed_headers.split(";")]:
        raise auth_failed("the signature must cover x-mq-date-time")
    return GrpcSignature(access_key.strip(), metadata.get("x-mq-date-time", ""), signature)


def grpc_date_ms(date_time: str, now_s: float) -> int:
    """Epoch ms of an ``x-mq-date-time`` value (read as UTC or as local time, whichever is nearer ``now_s``);
    AUTHENTICATION_FAILED when it does not parse."""
    match = _GRPC_DATE.match(date_time)
    if match is None:
        raise auth_failed("x-mq-date-time must look like 20250101T120000Z")
    year, month, day, hour, minute, second = (int(g) for g in match.groups())
    try:
        as_utc = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
        as_local = time.mktime((year, month, day, hour, minute, second, 0, 0, -1))
    except (OverflowError, ValueError):
        raise auth_failed("x-mq-date-time is not a valid time") from None
    best = min((as_utc, as_local), key=lambda t: abs(t - now_s))
    return int(best * 1000)
