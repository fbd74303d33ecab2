"""The declared limits of platform/common/validation.py: every error names the field and the bad value, a bool is
never an int, bounds are inclusive where declared so, and the declarations mean to msgspec what they mean here."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import msgspec
import pytest
from msgspec import Meta

from sparkmq.pipelines.alerts import AlertRule
from sparkmq.platform.auth.model import AclTable
from sparkmq.platform.broker.locks import _check_queues as lock_queues
from sparkmq.platform.broker.schedule import ScheduleService
from sparkmq.platform.client.allocation import AllocateConsistentHash
from sparkmq.platform.client.config import ClientConfig
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.failure_log import set_summary_interval
from sparkmq.platform.common.limits import ConnectionLimits
from sparkmq.platform.common.message import MessageQueue
from sparkmq.platform.common.validation import (
    ADDR_PATTERN,
    Addr,
    Port,
    PortOrOff,
    Ratio,
    Seconds,
    check,
    check_addr,
    check_fields,
    check_int,
    declared_fields,
    describe,
    split_addr,
    split_addrs,
)
from sparkmq.platform.namesrv.config import NameServerConfig
from sparkmq.platform.store.config import SegmentSize, StoreConfig


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None, [1], 10**30])
def test_check_int_refuses_what_is_no_int_in_range_naming_field_and_value(value: object) -> None:
    with pytest.raises(SparkMQError) as info:
        check_int("queue_id", value, 0, 65535)
    assert info.value.code is ErrorCode.INVALID_ARGUMENT
    assert info.value.message == f"queue_id must be an integer in 0..65535, got {value!r}"


def test_check_int_bounds_are_inclusive_and_the_upper_one_optional() -> None:
    assert check_int("n", 0, 0, 7) == 0 and check_int("n", 7, 0, 7) == 7
    for bad in (-1, 8):
        with pytest.raises(SparkMQError, match=rf"^INVALID_ARGUMENT: n must be an integer in 0\.\.7, got {bad}$"):
            check_int("n", bad, 0, 7)
    assert check_int("n", 10**30, 1) == 10**30
    with pytest.raises(SparkMQError, match=r"n must be an integer >= 1, got 0$"):
        check_int("n", 0, 1)


def test_the_site_chooses_the_error_code_or_class() -> None:
    with pytest.raises(SparkMQError) as info:
        check_int("queue_id", -1, 0, 3, ErrorCode.QUEUE_ID_ILLEGAL)
    assert info.value.code is ErrorCode.QUEUE_ID_ILLEGAL and info.value.http_status == 400
    with pytest.raises(ValueError, match=r"^port must be an integer in 0\.\.65535, got True$") as value_error:
        check("port", True, Port, ValueError)
    assert not isinstance(value_error.value, SparkMQError)


@pytest.mark.parametrize(("tp", "good", "bad"), [
    (Port, [0, 65535], [-1, 65536, True, 80.0, "80"]),
    (PortOrOff, [-1, 0, 65535], [-2, 65536, False]),
    (Seconds, [1, 0.001, 1e300], [0, -1, math.inf, math.nan, True, "1"]),
    (Ratio, [1, 0.5, 1.0], [0, 1.01, math.nan, True]),
    (Port | None, [None, 0], [-1, True]),
    (bool, [True, False], [0, 1, "true", None]),
    (Addr, ["127.0.0.1:1", "[::1]:65535", "broker-a.local:10911"],
     ["h:0", "h:65536", "h:080", "h", ":1", "h:1\n", "a b:1", 10911, None]),
])
def test_declared_types_allow_and_refuse(tp: object, good: list[object], bad: list[object]) -> None:
    for value in good:
        assert check("f", value, tp) is value
    for value in bad:
        with pytest.raises(SparkMQError) as info:
            check("some_field", value, tp)
        assert info.value.message.startswith(f"some_field must be {describe(tp)}, got ")
        assert info.value.message.endswith(repr(value)), info.value.message


@pytest.mark.parametrize("tp", [Port, PortOrOff, Seconds, Ratio, Addr, SegmentSize])
def test_msgspec_reads_the_declarations_alike(tp: object) -> None:
    # The Meta is also what msgspec enforces when it decodes (and states in a JSON schema): the same values pass.
    samples: list[object] = [-2, -1, 0, 1, 80, 65535, 65536, 0.5, 1.0, 1.5, math.inf, math.nan, True, "80",
                             "127.0.0.1:1", "h:65536", "[::1]:80", "h:080", None, 4096, 4097, 8192, 8192.0]
    for value in samples:
        try:
            msgspec.convert(value, tp, strict=True)
            msgspec_ok = True
        except msgspec.ValidationError:
            msgspec_ok = False
        try:
            check("f", value, tp)
            ours_ok = True
        except SparkMQError:
            ours_ok = False
        assert ours_ok == msgspec_ok, (tp, value)


def test_a_long_bad_value_is_shortened_in_the_message() -> None:
    with pytest.raises(SparkMQError) as info:
        check_addr("advertised_addr", "x" * 10_000)
    assert len(info.value.message) < 400 and "(10002 characters)" in info.value.message


@dataclass(frozen=True)
class _Conf:
    port: Port = 80
    timeout_s: Seconds = 1.0
    ha_port: PortOrOff | None = None
    enabled: bool = False
    name: Annotated[str, Meta(pattern="^[a-z]{1,3}$", description="1-3 lowercase letters")] = "ab"
    free: int = 0  # no limit declared: not checked

    def __post_init__(self) -> None:
        check_fields(self)


def test_check_fields_checks_every_declared_field_and_names_it() -> None:
    _Conf(free=True)  # type: ignore[arg-type]  # undeclared: not checked
    for field, value, expected in [("port", -1, "an integer in 0..65535"),
                                   ("timeout_s", 0, "a finite number of seconds > 0"),
                                   ("ha_port", True, "an integer in -1..65535"),
                                   ("enabled", 1, "true or false"),
                                   ("name", "abcd", "1-3 lowercase letters")]:
        with pytest.raises(ValueError) as info:
            _Conf(**{field: value})
        assert str(info.value) == f"{field} must be {expected}, got {value!r}"


def test_split_addr() -> None:
    assert split_addr("127.0.0.1:10911") == ("127.0.0.1", 10911)
    assert split_addr("[::1]:0") == ("::1", 0)
    for bad in ("nohost", ":80", "h:", "h:65536", "h:8a", "h:-1", "h:٣"):
        with pytest.raises(SparkMQError, match="must be 'host:port'") as info:
            split_addr(bad, "remoting address")
        assert info.value.code is ErrorCode.INVALID_ARGUMENT
        assert info.value.message.startswith("remoting address ") and repr(bad) in info.value.message


def test_split_addrs() -> None:
    assert split_addrs("a:1; b:2,a:1 http://c:3/") == ("a:1", "b:2", "c:3")
    assert split_addrs(["x:9876"]) == ("x:9876",)
    assert split_addrs(None) == () and split_addrs("") == ()
    with pytest.raises(ValueError, match=r"^an address of namesrv_addrs must be 'host:port' with a port in "
                                         r"1\.\.65535, got 'b:99999'$"):
        split_addrs("a:1;b:99999")
    with pytest.raises(ValueError, match=r"an address of namesrv_addrs must be a string, got 5"):
        split_addrs(["a:1", 5])
    with pytest.raises(ValueError, match=r"namesrv_addrs must be .* or a list, got 5"):
        split_addrs(5)


def test_addr_pattern_is_anchored_for_schemas() -> None:
    assert ADDR_PATTERN.startswith("^") and ADDR_PATTERN.endswith("$")


def _construct(cls: type, **kwargs: object) -> object:
    required: dict[str, object] = {
        "ClientConfig": {"namesrv_addrs": "127.0.0.1:9876"}, "StoreConfig": {"root": "/nonexistent/store"},
        "AlertRule": {"name": "r", "kind": "lag"}}.get(cls.__name__, {})  # type: ignore[assignment]
    return cls(**{**required, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [ClientConfig, NameServerConfig, ConnectionLimits, StoreConfig, AlertRule],
                         ids=lambda c: c.__name__)
def test_each_config_refuses_a_wrong_type_in_every_declared_field_naming_it(cls: type) -> None:
    declared = dict(declared_fields(cls))
    assert len(declared) >= 2
    for name, tp in declared.items():
        bad: object = 1 if describe(tp) == "true or false" else True  # a bool is no number, a number no bool
        with pytest.raises(ValueError) as info:
            _construct(cls, **{name: bad})
        prefix = "alert rule 'r': " if cls is AlertRule else ""
        assert str(info.value) == f"{prefix}{name} must be {describe(tp)}, got {bad!r}"


class _Levels:
    levels_ms = (1000, 5000)


def _raises(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except Exception as exc:  # noqa: BLE001  # the caller checks the type
        return exc
    raise AssertionError("no error")


@pytest.mark.parametrize(("call", "kind", "text"), [
    (lambda: MessageQueue("t", "b", True), ErrorCode.INVALID_ARGUMENT, "queue_id must be an integer >= 0, got True"),
    (lambda: AllocateConsistentHash(0), ErrorCode.INVALID_ARGUMENT, "virtual_nodes must be an integer >= 1, got 0"),
    (lambda: lock_queues([("t", 65536)]), ErrorCode.QUEUE_ID_ILLEGAL,
     "queue id must be an integer in 0..65535, got 65536"),
    (lambda: ScheduleService.level_delay_ms(_Levels(), 3), ErrorCode.INVALID_ARGUMENT,
     "delay level must be an integer in 1..2, got 3"),
    (lambda: AclTable.from_dict({"version": -1}), ValueError, "version must be an integer >= 0, got -1"),
    (lambda: set_summary_interval(math.inf), ValueError,
     "the summary interval must be a finite number of seconds > 0, got inf"),
])
def test_argument_checks_keep_their_code_and_name_the_argument_and_value(
        call: Callable[[], object], kind: ErrorCode | type[Exception], text: str) -> None:
    exc = _raises(call)
    if isinstance(kind, ErrorCode):
        assert isinstance(exc, SparkMQError) and exc.code is kind, exc
        assert exc.message == text
    else:
        assert type(exc) is kind and str(exc) == text
