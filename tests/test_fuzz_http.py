"""Bad input proven harmless over HTTP (issue 14): schemathesis over the OpenAPI schema of a real broker, name
server and gateway, and hypothesis over Arrow batch bodies, each bounded in time.

Every operation of each schema is fuzzed with data that fits the schema (it must reach the logic) and data
that breaks it (it must be refused).  Every answer must be a status the schema documents, never a 5xx; every
error is ``{"code", "message"}`` with a known code and that code's status; the commit log is the same after
every refused request; and the services log no unhandled exception.

The broker is configured so nothing it accepted writes later while a refused request is checked: delay
levels of a day, timer messages due at most 1 ms ahead, trace off, transaction check-backs after an hour.
Long polls are capped by ``long_polling_max_ms`` = 100 ms and the fuzzer's ``wait_ms`` by 50 ms (their
declared range, 0..MAX_LONG_POLL_MS, is exercised by the schema checks; holding 30 s per case would not).

A second, shorter pass (``test_signed_*``) fuzzes the same three schemas on services with ACL on, every
generated request signed by a super user (docs/security.md): the same checks hold past authentication, and
a refused request also leaves the service's ACL (and a name server's brokers and topics) as it was.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pyarrow as pa
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, assume, event, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from procs import BROKER, NAMESRV, ProcessHarness, ServiceProcess, wait_until, write_conf
from sparkmq.platform.auth import Credentials, Signer
from sparkmq.platform.client.remoting import SigningAuth
from sparkmq.platform.common import wire
from sparkmq.platform.common.errors import ErrorCode
from sparkmq.platform.common.protocol import MAX_LONG_POLL_MS

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(240)]

#: Each service's schemathesis run: after this many seconds every remaining operation gets a few cases only.
BUDGET_S = 35.0
#: Cases per operation and generation mode while within the budget, and after it.
EXAMPLES, EXAMPLES_LATE = 15, 3
#: The largest wait_ms the fuzzer sends (a held request per case would blow the budget).
FUZZ_WAIT_MS = 50
# not_a_server_error is asserted by hand: a 5xx is a failure unless it is a deliberate answer of EXPECTED_5XX.
CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance, negative_data_rejection]
#: 5xx codes that are answers, not failures: a query that needs the lake, on a broker that runs none.
EXPECTED_5XX = {"LAKE_NOT_AVAILABLE"}
#: What a service logs for an exception no handler answered.
UNHANDLED = ("unexpected error", "Traceback", "Exception in ASGI application")


@dataclass
class Services:
    """The processes under fuzz: a broker with a gateway in front (name server ``namesrv``), and a name server of
    its own (``lone_namesrv``: fuzzed registrations land there, not in the routes the gateway uses)."""

    namesrv: ServiceProcess
    broker: ServiceProcess
    gateway: ServiceProcess
    lone_namesrv: ServiceProcess


@pytest.fixture(scope="module")
def services(module_procs: ProcessHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    tmp = tmp_path_factory.mktemp("fuzz-http")
    namesrv, lone = module_procs.start_many([("namesrv", NAMESRV, ["--scan-interval-s", "0.5"])] * 2)
    broker = module_procs.start(
        "broker", BROKER, "--data-dir", str(tmp / "broker"), "--namesrv", namesrv.addr, "--register-interval-s", "0.5",
        "--no-trace", "--long-polling-max-ms", "100", "--message-delay-level", "1d 2d", "--timer-max-delay-s", "0.001",
        "--transaction-check-first-s", "3600", "--transaction-check-interval-s", "3600")
    gateway = module_procs.start("gateway", "sparkmq.api.gateway_main", "--namesrv", namesrv.addr,
                                 "--send-timeout-s", "3")
    # A topic the gateway can route to, so some generated sends get through it.
    httpx.post(f"{broker.url}/topics", json={"topic": "Fuzz", "read_queue_nums": 2, "write_queue_nums": 2},
               timeout=10).raise_for_status()
    wait_until(lambda: httpx.get(f"{namesrv.url}/routes/Fuzz", timeout=5).status_code == 200, 20, "the Fuzz route")
    yield Services(namesrv, broker, gateway, lone)
    _HTTP.close()


#: One keep-alive connection for the many offset reads (closed with the services).
_HTTP = httpx.Client(timeout=10)


def max_offset(broker: ServiceProcess, http: httpx.Client = _HTTP) -> int:
    """The broker's commit-log max offset (``http`` signs the read of a broker with ACL on)."""
    return int(http.get(f"{broker.url}/broker").json()["commitlog"]["max_offset"])


def quiet_max_offset(broker: ServiceProcess, http: httpx.Client = _HTTP) -> int:
    """The max offset once it stopped moving (what an accepted request queued has been written)."""
    last = max_offset(broker, http)
    while True:
        time.sleep(0.2)
        now = max_offset(broker, http)
        if now == last:
            return now
        last = now


def assert_error_body(response: httpx.Response | Any, where: str) -> str:
    """An error answer is {"code", "message"} with a known code whose status it has; returns the code."""
    body = response.json()
    assert set(body) == {"code", "message"}, f"{where}: {response.status_code} {body!r}"
    assert body["code"] in ErrorCode.__members__, f"{where}: unknown code {body!r}"
    assert ErrorCode[body["code"]].http_status == response.status_code, f"{where}: {response.status_code} {body!r}"
    return body["code"]


def assert_no_unhandled(service: ServiceProcess) -> None:
    log = service.log()
    for marker in UNHANDLED:
        assert marker not in log, f"{service.kind} logged an unhandled exception:\n{log[-6000:]}"


def cap_waits(case: schemathesis.Case, polls: set[str]) -> None:
    """Long-poll waits (operations in ``polls``) in range, or left to their default, become at most FUZZ_WAIT_MS
    (out-of-range ones stay: they must be refused)."""
    if case.operation.label not in polls:
        return
    if case.query is None:
        case.query = {}
    wait = case.query.get("wait_ms", 0)
    if isinstance(wait, int) and not isinstance(wait, bool) and 0 <= wait <= MAX_LONG_POLL_MS:
        case.query["wait_ms"] = min(wait, FUZZ_WAIT_MS)


def integral_floats_as_ints(value: Any) -> Any:
    """JSON Schema counts 5.0 as an integer and schemathesis generates it; the apps' strict models refuse it
    by design (a queue id is written 5).  The fuzzer sends such numbers as integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: integral_floats_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral_floats_as_ints(v) for v in value]
    return value


#: What starts the message of an answer that request validation (the schema) refused.
VALIDATION_PREFIXES = ("path.", "query.", "body.", "header.", "malformed JSON")
#: A percent escape: schemathesis sends "%4e" in a path parameter as is, so the server reads "N" (not the value).
ESCAPE = re.compile("%[0-9A-Fa-f]{2}")


@dataclass
class Tally:
    """Answers per operation: how many cases got 2xx, 4xx."""

    ok: int = 0
    refused: int = 0
    replayed: int = 0
    seconds: float = 0.0


class RequestSigner(requests.auth.AuthBase):
    """Signs each request schemathesis sends (it sends with ``requests``): method, the path and query as sent,
    the body and the time, as :class:`~sparkmq.platform.client.remoting.SigningAuth` does for httpx."""

    def __init__(self, credentials: Credentials) -> None:
        self._signer = Signer(credentials)

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        body = request.body or b""
        body = body.encode() if isinstance(body, str) else body
        request.headers.update(self._signer.http_headers(request.method or "GET", request.path_url, body))
        return request


def fuzz_schema(url: str, store: ServiceProcess | None, *, credentials: Credentials | None = None,
                snapshot: Callable[[], Any] | None = None, budget_s: float = BUDGET_S,
                examples: tuple[int, int] = (EXAMPLES, EXAMPLES_LATE)) -> dict[str, Tally]:
    """Run schemathesis over every operation of the schema at ``url`` in both generation modes; with ``store``
    (a broker) every refused request must leave its commit log as it was.  Returns the tally per operation.

    ``credentials`` sign every request (and the checks' own reads); ``snapshot()`` is read before each case
    and must read the same after a refused one (an ACL, a name server's brokers)."""
    http = _HTTP if credentials is None else httpx.Client(timeout=10, auth=SigningAuth(credentials))
    auth = {} if credentials is None else {"auth": RequestSigner(credentials)}
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    raw = httpx.get(f"{url}/openapi.json", timeout=10).json()
    polls = {f"{method.upper()} {path}" for path, item in raw["paths"].items() for method, op in item.items()
             if any(p["name"] == "wait_ms" for p in op.get("parameters", []))}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations, "the schema has no operations"
    started = time.monotonic()
    tallies: dict[str, Tally] = {}

    def send(case: schemathesis.Case) -> Any:
        return case.call(base_url=url, timeout=10, **auth)

    for operation in operations:
        tally = tallies.setdefault(operation.label, Tally())
        late = time.monotonic() - started > budget_s
        op_started = time.monotonic()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=examples[1] if late else examples[0], deadline=None, database=None,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def one(case: schemathesis.Case) -> None:
                cap_waits(case, polls)
                if isinstance(case.body, dict | list):
                    case.body = integral_floats_as_ints(case.body)
                assume(not any(isinstance(v, str) and ESCAPE.search(v) for v in (case.path_parameters or {}).values()))
                positive = case.meta is None or case.meta.generation.mode is GenerationMode.POSITIVE
                before = max_offset(store, http) if store is not None else 0
                seen = snapshot() if snapshot is not None else None
                response = send(case)
                where = f"{case.operation.label} {case.as_curl_command()}"
                if response.status_code >= 500:
                    assert assert_error_body(response, where) in EXPECTED_5XX, f"{where}: {response.text[:500]}"
                case.validate_response(response, checks=CHECKS)
                if response.status_code < 400:
                    tally.ok += 1  # noqa: B023  (called at once, in this iteration)
                    return
                tally.refused += 1  # noqa: B023
                assert_error_body(response, where)
                if snapshot is not None:
                    assert snapshot() == seen, f"{where}: a refused request changed the service's state"
                if positive:  # data the schema allows must pass request validation and reach the logic
                    assert not response.json()["message"].startswith(VALIDATION_PREFIXES), \
                        f"{where}: the schema allows what validation refused: {response.text[:500]}"
                if store is not None and max_offset(store, http) != before:
                    # Something accepted earlier may still be writing: wait for quiet, then refuse it again.
                    tally.replayed += 1  # noqa: B023
                    before = quiet_max_offset(store, http)
                    again = send(case)
                    assert again.status_code >= 400, f"{where}: refused once, then {again.status_code}"
                    assert max_offset(store, http) == before, f"{where}: a refused request changed the commit log"
            try:
                one()
            except Unsatisfiable:
                # No parameter and no body: nothing to break (the positive run covered the operation).
                assert mode is GenerationMode.NEGATIVE, operation.label
        tally.seconds = time.monotonic() - op_started
    for label, t in tallies.items():  # shown with -s, and in a failure's captured output
        print(f"{url} {label}: {t.ok} accepted, {t.refused} refused ({t.replayed} replayed), {t.seconds:.1f} s")
    if http is not _HTTP:
        http.close()
    return tallies


def test_schemathesis_over_the_broker(services: Services) -> None:
    tallies = fuzz_schema(services.broker.url, services.broker)
    assert len(tallies) >= 30, sorted(tallies)
    # Data the schema allows reaches the logic: most operations accept some of it (the rest need state the
    # fuzzer does not make: a message id that exists, a DLedger group, a pending transaction).
    accepted = [label for label, t in tallies.items() if t.ok]
    assert len(accepted) >= len(tallies) * 0.6, {label: vars(t) for label, t in tallies.items()}
    assert_no_unhandled(services.broker)
    assert httpx.get(f"{services.broker.url}/health", timeout=5).status_code == 200


def test_schemathesis_over_the_name_server(services: Services) -> None:
    tallies = fuzz_schema(services.lone_namesrv.url, None)
    assert {"POST /brokers/register", "GET /routes/{topic}", "DELETE /topics/{topic}"} <= set(tallies)
    assert tallies["POST /brokers/register"].ok > 0, "no generated registration was accepted"
    assert_no_unhandled(services.lone_namesrv)


def test_schemathesis_over_the_gateway(services: Services) -> None:
    before = max_offset(services.broker)
    tallies = fuzz_schema(services.gateway.url, None)
    assert {"POST /topics/{topic}/messages", "POST /topics/{topic}/batch", "GET /routes/{topic}"} <= set(tallies)
    assert_no_unhandled(services.gateway)
    # A send the gateway accepted is stored in the broker behind it (the gateway answers after the broker did).
    sent = tallies["POST /topics/{topic}/messages"].ok + tallies["POST /topics/{topic}/batch"].ok
    after = max_offset(services.broker)
    if sent:
        assert after > before, f"{sent} sends accepted, the commit log still ends at {before}"
    ok = httpx.post(f"{services.gateway.url}/topics/Fuzz/messages", json={"body": "after the fuzz"}, timeout=10)
    assert ok.status_code == 200, ok.text
    assert max_offset(services.broker) > after


# -- with credentials: the same checks past authentication --------------------------------------------------
#: The super user every signed request is made by (the config's bootstrap user of each service).
ROOT = Credentials("root", "root-secret-1")
#: A service's signed pass: after this many seconds every remaining operation gets a couple of cases only
#: (about 30 s per service in all).
SIGNED_BUDGET_S = 10.0
SIGNED_EXAMPLES = (6, 1)


@dataclass
class SignedServices:
    """Services with ACL on (``root`` their bootstrap super user): a broker behind a name server and a gateway,
    and a name server of its own for fuzzed registrations."""

    namesrv: ServiceProcess
    broker: ServiceProcess
    gateway: ServiceProcess
    lone_namesrv: ServiceProcess
    http: httpx.Client

    def acl(self, service: ServiceProcess) -> dict[str, Any]:
        """The users and policies of ``service``."""
        return {"users": self.http.get(f"{service.url}/acl/users").json(),
                "policies": self.http.get(f"{service.url}/acl/policies").json()}


def _acl_table(table: str, data_dir: Any, **extra: Any) -> str:
    keys = {"data_dir": str(data_dir), "acl_enabled": True, "acl_super_user_access_key": ROOT.access_key,
            "acl_super_user_secret_key": ROOT.secret_key, **extra}
    return "\n".join([f"[{table}]"] + [f"{k} = {v!r}" if not isinstance(v, bool) else f"{k} = {str(v).lower()}"
                                      for k, v in keys.items()]) + "\n"


@pytest.fixture(scope="module")
def signed_services(module_procs: ProcessHarness, tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[SignedServices]:
    tmp = tmp_path_factory.mktemp("fuzz-http-acl")
    for name in ("namesrv", "lone"):
        (tmp / f"{name}.toml").write_text(_acl_table("namesrv", tmp / name))
    (tmp / "gateway.toml").write_text(_acl_table("gateway", tmp / "gateway", access_key=ROOT.access_key,
                                                 secret_key=ROOT.secret_key))
    # The lone name server keeps what the fuzzer registers for the whole run: its snapshot compares brokers.
    namesrv, lone = module_procs.start_many([
        ("namesrv", NAMESRV, ["--config", str(tmp / "namesrv.toml"), "--scan-interval-s", "0.5"]),
        ("namesrv", NAMESRV, ["--config", str(tmp / "lone.toml"), "--broker-expiry-s", "3600"])])
    conf = write_conf(tmp / "broker.toml", tmp / "broker", acl_enabled=True, acl_super_user_access_key=ROOT.access_key,
                      acl_super_user_secret_key=ROOT.secret_key)
    broker = module_procs.start(
        "broker", BROKER, "--config", str(conf), "--namesrv", namesrv.addr, "--register-interval-s", "0.5",
        "--no-trace", "--long-polling-max-ms", "100", "--message-delay-level", "1d 2d", "--timer-max-delay-s", "0.001",
        "--transaction-check-first-s", "3600", "--transaction-check-interval-s", "3600")
    gateway = module_procs.start("gateway", "sparkmq.api.gateway_main", "--namesrv", namesrv.addr,
                                 "--config", str(tmp / "gateway.toml"), "--send-timeout-s", "3")
    http = httpx.Client(timeout=10, auth=SigningAuth(ROOT))
    http.post(f"{broker.url}/topics", json={"topic": "Fuzz", "read_queue_nums": 2, "write_queue_nums": 2}
              ).raise_for_status()
    wait_until(lambda: http.get(f"{namesrv.url}/routes/Fuzz").status_code == 200, 20, "the Fuzz route (signed)")
    yield SignedServices(namesrv, broker, gateway, lone, http)
    http.close()


def test_signed_schemathesis_over_the_broker(signed_services: SignedServices) -> None:
    s = signed_services
    tallies = fuzz_schema(s.broker.url, s.broker, credentials=ROOT, snapshot=lambda: s.acl(s.broker),
                          budget_s=SIGNED_BUDGET_S, examples=SIGNED_EXAMPLES)
    assert {"GET /acl/users", "POST /acl/policies"} <= set(tallies)
    accepted = [label for label, t in tallies.items() if t.ok]
    assert len(accepted) >= len(tallies) * 0.6, {label: vars(t) for label, t in tallies.items()}
    assert_no_unhandled(s.broker)
    assert s.http.get(f"{s.broker.url}/topics").status_code == 200


def test_signed_schemathesis_over_the_name_server(signed_services: SignedServices) -> None:
    s = signed_services
    lone = s.lone_namesrv

    def state() -> dict[str, Any]:
        cluster = s.http.get(f"{lone.url}/cluster").json()
        return {"brokers": cluster["brokers"], "topics": s.http.get(f"{lone.url}/topics").json(), **s.acl(lone)}
    tallies = fuzz_schema(lone.url, None, credentials=ROOT, snapshot=state, budget_s=SIGNED_BUDGET_S,
                          examples=SIGNED_EXAMPLES)
    assert {"POST /brokers/register", "GET /routes/{topic}", "POST /acl/users"} <= set(tallies)
    assert tallies["POST /brokers/register"].ok > 0, "no signed registration was accepted"
    assert_no_unhandled(lone)
    assert httpx.get(f"{lone.url}/topics", timeout=5).status_code == 401, "still closed to unsigned requests"


def test_signed_schemathesis_over_the_gateway(signed_services: SignedServices) -> None:
    s = signed_services
    tallies = fuzz_schema(s.gateway.url, s.broker, credentials=ROOT, snapshot=lambda: s.acl(s.gateway),
                          budget_s=SIGNED_BUDGET_S, examples=SIGNED_EXAMPLES)
    assert {"POST /topics/{topic}/messages", "GET /routes/{topic}", "POST /acl/users"} <= set(tallies)
    assert tallies["POST /topics/{topic}/messages"].ok > 0, "no signed send got through the gateway"
    assert_no_unhandled(s.gateway)
    ok = s.http.post(f"{s.gateway.url}/topics/Fuzz/messages", json={"body": "after the signed fuzz"})
    assert ok.status_code == 200, ok.text


# -- Arrow batch bodies -----------------------------------------------------------------------------------

_COLUMN_TYPES = {
    "body": [pa.binary(), pa.string(), pa.large_binary(), pa.int64(), pa.list_(pa.int8())],
    "tags": [pa.string(), pa.binary(), pa.int32()],
    "keys": [pa.string(), pa.large_string(), pa.list_(pa.string())],
    "properties": [pa.map_(pa.string(), pa.string()), pa.map_(pa.int32(), pa.string()),
                   pa.map_(pa.string(), pa.int64()), pa.string()],
    "extra": [pa.string()],
}
_TEXT = st.text(max_size=12)


def _plain(kind: pa.DataType) -> st.SearchStrategy[Any]:
    """Non-null values of an Arrow type."""
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return st.binary(max_size=40)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return _TEXT
    if pa.types.is_integer(kind):
        return st.integers(-100, 100)
    if pa.types.is_list(kind):
        return st.lists(_values(kind.value_type), max_size=3)
    return st.lists(st.tuples(_plain(kind.key_type), _values(kind.item_type)), max_size=3)  # a map


def _values(kind: pa.DataType) -> st.SearchStrategy[Any]:
    """Values or nulls of an Arrow type."""
    return st.one_of(st.none(), _plain(kind))


@st.composite
def arrow_tables(draw: st.DrawFn) -> bytes:
    """An Arrow IPC stream of a table with some of SEND_SCHEMA's columns (or others), of any of several types."""
    names = draw(st.lists(st.sampled_from(sorted(_COLUMN_TYPES)), min_size=1, max_size=4, unique=True))
    rows = draw(st.integers(0, 4))
    columns = {}
    for name in names:
        kind = draw(st.sampled_from(_COLUMN_TYPES[name]))
        columns[name] = pa.array(draw(st.lists(_values(kind), min_size=rows, max_size=rows)), type=kind)
    return wire.to_ipc(pa.table(columns))


_GOOD = wire.send_rows_to_arrow([wire.SendRow(b"a body", "TagA", ("k1",), {"p": "v"}),
                                 wire.SendRow(b"another", None, (), {})])
_GOOD_IPC = wire.to_ipc(_GOOD)


@st.composite
def mutated_ipc(draw: st.DrawFn) -> bytes:
    """A well-formed batch with bytes overwritten, cut off, or inserted."""
    data = bytearray(_GOOD_IPC)
    for _ in range(draw(st.integers(1, 8))):
        how = draw(st.sampled_from(["flip", "cut", "insert"]))
        at = draw(st.integers(0, len(data) - 1))
        if how == "flip":
            data[at] = draw(st.integers(0, 255))
        elif how == "cut":
            del data[at:at + draw(st.integers(1, 64))]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        if not data:
            break
    return bytes(data)


#: Batches of SEND_SCHEMA with any content: they pass the Arrow checks and reach the message rules.
_NAME = st.text(st.characters(codec="ascii"), min_size=1, max_size=8)
send_batches = st.lists(st.builds(wire.SendRow, body=st.binary(max_size=30), tags=st.none() | _NAME,
                                  keys=st.lists(_NAME, max_size=2).map(tuple),
                                  properties=st.dictionaries(_NAME, st.text(max_size=8), max_size=3)),
                        max_size=4).map(lambda rows: wire.to_ipc(wire.send_rows_to_arrow(rows)))
ARROW_BODIES = st.one_of(send_batches, arrow_tables(), mutated_ipc(), st.binary(max_size=600))


def _post_arrow(url: str, body: bytes, topic: str = "Fuzz") -> httpx.Response:
    return httpx.post(f"{url}/topics/{topic}/batch", content=body, timeout=10,
                      headers={"content-type": wire.ARROW_STREAM})


@settings(max_examples=250, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(body=ARROW_BODIES)
def test_arrow_batch_bodies_are_stored_whole_or_refused_and_change_nothing(services: Services, body: bytes) -> None:
    broker = services.broker
    before = max_offset(broker)
    answer = _post_arrow(broker.url, body)
    assert answer.status_code < 500, answer.text
    event(f"{answer.status_code} {answer.json().get('code', '')}")
    if answer.status_code == 200:
        assert answer.json()["results"], answer.text  # an empty batch is refused
        assert max_offset(broker) > before
        return
    assert assert_error_body(answer, "arrow batch") in {"MESSAGE_ILLEGAL", "MESSAGE_TOO_LARGE",
                                                         "PROPERTIES_TOO_LARGE"}, answer.text
    assert max_offset(broker) == before, "a refused Arrow batch changed the commit log"


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(body=ARROW_BODIES)
def test_arrow_batch_bodies_at_the_gateway(services: Services, body: bytes) -> None:
    answer = _post_arrow(services.gateway.url, body)
    assert answer.status_code < 500, answer.text
    if answer.status_code >= 400:
        assert_error_body(answer, "gateway arrow batch")


def test_a_good_arrow_batch_still_works_and_nothing_was_unhandled(services: Services) -> None:
    answer = _post_arrow(services.broker.url, _GOOD_IPC)
    assert answer.status_code == 200 and len(answer.json()["results"]) == 2, answer.text
    assert_no_unhandled(services.broker)
    assert_no_unhandled(services.gateway)


def test_long_poll_waits_are_capped_at_the_declared_maximum(services: Services) -> None:
    url = services.broker.url
    schema = httpx.get(f"{url}/openapi.json", timeout=5).json()
    waits = {(path, p["name"]): p["schema"] for path, item in schema["paths"].items()
             for op in item.values() for p in op.get("parameters", []) if p["name"] == "wait_ms"}
    assert {path for path, _ in waits} == {"/topics/{topic}/queues/{queue_id}/messages",
                                           "/consumers/{group}/changes", "/transactions/checks"}
    assert all(s["maximum"] == MAX_LONG_POLL_MS and s["minimum"] == 0 for s in waits.values()), waits
    requests: list[tuple[str, dict[str, Any]]] = [
        ("/topics/Fuzz/queues/0/messages", {}), ("/consumers/g1/changes", {}),
        ("/transactions/checks", {"producer_group": "pg1"})]
    for path, params in requests:
        started = time.monotonic()
        answer = httpx.get(f"{url}{path}", params={**params, "wait_ms": 80_000}, timeout=10)
        assert answer.status_code == 400 and answer.json()["code"] == "INVALID_ARGUMENT", (path, answer.text)
        assert time.monotonic() - started < 2, f"{path}: a refused wait was held"
        assert str(MAX_LONG_POLL_MS) in answer.json()["message"]


def test_declared_constraints_answer_the_logics_codes(services: Services) -> None:
    url = services.broker.url
    cases: list[tuple[Callable[[], httpx.Response], str]] = [
        (lambda: httpx.get(f"{url}/topics/{'t' * 128}/stats"), "TOPIC_ILLEGAL"),
        (lambda: httpx.get(f"{url}/topics/a%0A/stats"), "TOPIC_ILLEGAL"),          # a trailing newline
        (lambda: httpx.get(f"{url}/consumers/{'g' * 121}"), "GROUP_ILLEGAL"),
        (lambda: httpx.get(f"{url}/topics/Fuzz/queues/-1/offsets"), "QUEUE_ID_ILLEGAL"),
        (lambda: httpx.get(f"{url}/topics/Fuzz/queues/0/messages", params={"offset": -1}), "OFFSET_ILLEGAL"),
        (lambda: httpx.get(f"{url}/topics/Fuzz/queues/0/messages", params={"filter_type": "XPATH"}),
         "FILTER_EXPRESSION_ILLEGAL"),
        (lambda: httpx.post(f"{url}/consumers/g1/offsets/reset", json={"topic": "Fuzz", "offsets": {"x": 1}}),
         "QUEUE_ID_ILLEGAL"),
        (lambda: httpx.post(f"{url}/topics/Fuzz/batch", json={"messages": []}), "MESSAGE_ILLEGAL"),
        (lambda: httpx.get(f"{url}/topics/Fuzz/queues/x/messages"), "INVALID_ARGUMENT"),   # a wrong type
        (lambda: httpx.get(f"{services.lone_namesrv.url}/routes/{'y' * 128}"), "TOPIC_ILLEGAL"),
    ]
    before = max_offset(services.broker)
    for call, code in cases:
        answer = call()
        assert answer.status_code == ErrorCode[code].http_status and answer.json()["code"] == code, answer.text
    assert max_offset(services.broker) == before
    retry_topic = "%RETRY%" + "g" * 200  # retry and DLQ topics may be up to 255 characters
    assert httpx.get(f"{url}/topics/{retry_topic.replace('%', '%25')}/stats").status_code != 400


def test_an_arrow_batch_with_a_string_that_is_not_utf8_is_message_illegal(services: Services) -> None:
    """Found by the fuzzer: such a batch read fine and failed in to_pylist (500 INTERNAL_ERROR); the broker now
    validates the whole table first."""
    raw = bytearray(wire.to_ipc(wire.send_rows_to_arrow([wire.SendRow(b"x", "TagAé", (), {})])))
    raw[raw.find("TagAé".encode()) + 4] = 0xEC  # the first byte of "é" made a bad UTF-8 lead
    before = max_offset(services.broker)
    answer = _post_arrow(services.broker.url, bytes(raw))
    assert answer.status_code == 400 and answer.json()["code"] == "MESSAGE_ILLEGAL", answer.text
    assert "UTF8" in answer.json()["message"]
    assert max_offset(services.broker) == before
