"""The HTTP contract is the protocol layer's (issue 29): the OpenAPI documents of the broker, the name server and
the gateway state exactly the limits of ``platform/common/http_contract.py`` (and of the values typed in
``platform/common/validation.py``), a value a remoting header and an HTTP body both carry has one declared type,
and the servers enforce every declared limit -- at the limit a value is taken, one past it is refused with the
code the logic gives it (TOPIC_ILLEGAL, QUEUE_ID_ILLEGAL, ...) and changes nothing.

The limits below are read from the declarations (``msgspec.inspect``), never restated: change a limit in the
contract and these tests follow it; state a different one anywhere else and they fail.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, Any, Union, get_args, get_origin

import msgspec
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient

from sparkmq.api import broker_app, gateway_app, namesrv_app
from sparkmq.api.params import Declared
from sparkmq.platform.broker.broker import Broker
from sparkmq.platform.broker.config import BrokerConfig
from sparkmq.platform.client.config import ClientConfig
from sparkmq.platform.client.producer import Producer
from sparkmq.platform.common import http_contract as contract
from sparkmq.platform.common import protocol as p
from sparkmq.platform.common import validation
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.namesrv import NameServerConfig, RouteTable
from sparkmq.platform.remoting.codec import decode_header

#: The keywords of a JSON schema that state a limit (what must not drift).
LIMITS = ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
          "maxLength", "pattern", "minItems", "maxItems", "enum", "const", "required", "additionalProperties",
          "propertyNames", "properties", "items", "anyOf", "$ref")


# -- the apps ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    config = BrokerConfig(data_dir=tmp_path_factory.mktemp("contract"), long_polling_max_ms=100,
                          store={"segment_size": 1 << 20, "max_message_size": 64 * 1024})
    started = Broker(config).start(register=False)
    yield started
    started.shutdown()


@pytest.fixture(scope="module")
def apps(broker: Broker) -> dict[str, FastAPI]:
    producer = Producer("contract-pg", ClientConfig(namesrv_addrs="127.0.0.1:9"))  # never started: no sends
    return {"broker": broker_app.create_app(broker),
            "namesrv": namesrv_app.create_app(RouteTable(), NameServerConfig()),
            "gateway": gateway_app.create_app(producer)}


@pytest.fixture(scope="module")
def clients(apps: dict[str, FastAPI]) -> dict[str, TestClient]:
    return {name: TestClient(app) for name, app in apps.items()}  # no lifespan: the gateway's producer stays off


def _resolve(node: Any, components: dict[str, Any]) -> Any:
    """``node`` with every ``$ref`` into ``components`` put in place."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            return _resolve(components[ref.rsplit("/", 1)[1]], components)
        return {k: _resolve(v, components) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, components) for v in node]
    return node


def _limits(node: Any, components: dict[str, Any]) -> Any:
    """The limit keywords of a schema, refs resolved (titles, descriptions and defaults left out)."""
    node = _resolve(node, components)

    def keep(n: Any, in_properties: bool = False) -> Any:
        if isinstance(n, dict):
            if in_properties:  # property names, not keywords
                return {k: keep(v) for k, v in n.items()}
            return {k: keep(v, k == "properties") for k, v in n.items() if k in LIMITS}
        if isinstance(n, list):
            return sorted((keep(v) for v in n), key=repr)
        return n
    return keep(node)


def _msgspec_limits(kind: Any) -> Any:
    (schema,), components = msgspec.json.schema_components([kind], ref_template="#/$defs/{name}")
    return _limits(schema, components)


def _documented_bodies(app: FastAPI) -> dict[tuple[str, str], Any]:
    """(method, path) -> the JSON request body schema of each operation that has one."""
    doc = app.openapi()
    out = {}
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                out[(method, path)] = content["application/json"]["schema"]
    return out


# -- the documents are generated from the contract ------------------------------------------------------------

BODIES = {"broker": contract.BROKER_BODIES, "namesrv": contract.NAMESRV_BODIES, "gateway": contract.GATEWAY_BODIES}


@pytest.mark.parametrize("name", ["broker", "namesrv", "gateway"])
def test_every_body_in_the_openapi_document_states_the_contracts_limits(apps: dict[str, FastAPI], name: str) -> None:
    app = apps[name]
    components = app.openapi()["components"]["schemas"]
    documented = _documented_bodies(app)
    seen = set()
    for (method, path), schema in documented.items():
        ref = schema.get("$ref", "")
        assert ref.startswith("#/components/schemas/"), (method, path, schema)
        kind = getattr(contract, ref.rsplit("/", 1)[1])
        assert _limits(schema, components) == _msgspec_limits(kind), (method, path)
        seen.add(kind)
    serves_acl = any(path.startswith("/acl") for path in app.openapi()["paths"])
    assert serves_acl == (name == "broker")  # the name server and the gateway serve /acl with ACL on
    expected = set(BODIES[name]) | (set(contract.ACL_BODIES) if serves_acl else set())
    assert seen == expected, "every body of the contract is documented, and only those"
    # The limits are really there (a comparison of two empty documents proves nothing).
    sample = {"broker": "OffsetEntry", "namesrv": "TopicConfigBody", "gateway": "SendMessageBody"}[name]
    assert "'maximum'" in str(_limits(components[sample], components))


def _declared_parameters(app: FastAPI) -> Iterator[tuple[str, str, str, Any]]:
    """(method, path, parameter, contract type) of every path and query parameter typed by the contract."""
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if not isinstance(route, APIRoute):
            continue
        for param in route.dependant.path_params + route.dependant.query_params:
            declared = [m for m in _metadata(param.field_info.annotation) + list(param.field_info.metadata)
                        if isinstance(m, Declared)]
            for method in route.methods or ():
                for d in declared:
                    yield method.lower(), str(context.path_format), param.alias, d.tp


def _metadata(tp: Any) -> list[Any]:
    out: list[Any] = []
    if get_origin(tp) is Annotated:
        out += list(tp.__metadata__) + _metadata(tp.__origin__)
    elif get_origin(tp) in (Union, type(int | None)):
        for arg in get_args(tp):
            out += _metadata(arg)
    return out


@pytest.mark.parametrize("name", ["broker", "namesrv", "gateway"])
def test_every_declared_parameter_states_the_contracts_limits(apps: dict[str, FastAPI], name: str) -> None:
    app = apps[name]
    doc = app.openapi()
    components = doc["components"]["schemas"]
    checked = 0
    for method, path, param, tp in _declared_parameters(app):
        documented = next(p_ for p_ in doc["paths"][path][method]["parameters"] if p_["name"] == param)["schema"]
        if "anyOf" in documented:  # an optional parameter: the value's schema beside null
            documented = next(s for s in documented["anyOf"] if s.get("type") != "null")
        assert _limits(documented, components) == _msgspec_limits(tp), (method, path, param)
        checked += 1
    assert checked >= {"broker": 30, "namesrv": 3, "gateway": 4}[name], checked
    # And no parameter states a limit the contract does not: every constrained one is declared.
    declared = {(method, path, param) for method, path, param, _ in _declared_parameters(app)}
    for path, item in doc["paths"].items():
        if path.startswith("/acl"):
            continue
        for method, operation in item.items():
            for parameter in operation.get("parameters", []):
                stated = _limits(parameter["schema"], components)
                if any(k in str(stated) for k in ("'minimum'", "'maximum'", "'pattern'", "Length'")):
                    assert (method, path, parameter["name"]) in declared, (method, path, parameter)


# -- one declaration for a header's field and a body's ----------------------------------------------------------

def _field(kind: type[msgspec.Struct], name: str) -> Any:
    return next(f.type for f in msgspec.structs.fields(kind) if f.encode_name == name)


def _named(tp: Any) -> Any:
    """The named type under ``tp``'s optional ``| None`` and a field's own description (``Annotated[T | None,
    Meta(description=...)]`` -> ``T``)."""
    if get_origin(tp) is Annotated and all(m.description and not m.extra and m.ge is None and m.pattern is None
                                           for m in tp.__metadata__ if isinstance(m, msgspec.Meta)) \
            and get_origin(tp.__origin__) in (Union, type(int | None)):
        tp = tp.__origin__
    if get_origin(tp) in (Union, type(int | None)):
        tp = next(a for a in get_args(tp) if a is not type(None))
    return tp


#: (remoting header, its field, HTTP body, its field): the same value in both protocols.
SHARED = [
    (p.SendMessageRequestHeader, "topic", contract.RedriveBody, "topic"),
    (p.SendMessageRequestHeader, "queueId", contract.SendMessageBody, "queue_id"),
    (p.SendMessageRequestHeaderV2, "e", contract.SendMessageBody, "queue_id"),
    (p.SendPackedRequestHeader, "queueId", contract.SendMessageBody, "queue_id"),
    (p.PullMessageRequestHeader, "topic", contract.QueueBody, "topic"),
    (p.PullMessageRequestHeader, "queueId", contract.QueueBody, "queue_id"),
    (p.UpdateConsumerOffsetRequestHeader, "topic", contract.OffsetEntry, "topic"),
    (p.UpdateConsumerOffsetRequestHeader, "queueId", contract.OffsetEntry, "queue_id"),
    (p.QueryConsumerOffsetRequestHeader, "queueId", contract.OffsetEntry, "queue_id"),
    (p.QueueRequestHeader, "topic", contract.TopicBody, "topic"),
    (p.QueueRequestHeader, "queueId", contract.QueueBody, "queue_id"),
    (p.SearchOffsetRequestHeader, "queueId", contract.QueueBody, "queue_id"),
]


@pytest.mark.parametrize(("header", "field", "body", "body_field"), SHARED,
                         ids=[f"{h.__name__}.{f}" for h, f, _, _ in SHARED])
def test_a_value_of_a_remoting_header_and_an_http_body_has_one_declaration(
        header: type[msgspec.Struct], field: str, body: type[msgspec.Struct], body_field: str) -> None:
    named = _named(_field(header, field))
    assert named is _named(_field(body, body_field))
    assert named is validation.TopicName or named is validation.QueueId


def test_the_declared_names_are_what_the_logic_checks() -> None:
    """TopicName and GroupName state validate_topic's and validate_group's limits (the same constants)."""
    def declared_ok(tp: Any, value: str) -> bool:
        try:
            msgspec.convert(value, tp)
        except msgspec.ValidationError:
            return False
        return True

    def logic_ok(check: Callable[[str], str], value: str) -> bool:
        try:
            check(value)
        except SparkMQError:
            return False
        return True

    longest = validation.MAX_TOPIC_LENGTH
    for value in ["t" * longest, "t" * (longest + 1), "%RETRY%" + "g" * (validation.MAX_SYSTEM_TOPIC_LENGTH - 7),
                  "%RETRY%" + "g" * (validation.MAX_SYSTEM_TOPIC_LENGTH - 6), "a b", "", "x|y%z", "é"]:
        assert declared_ok(validation.TopicName, value) == logic_ok(validation.validate_topic, value), value
    for value in ["g" * validation.MAX_GROUP_LENGTH, "g" * (validation.MAX_GROUP_LENGTH + 1), "a,b", ""]:
        assert declared_ok(validation.GroupName, value) == logic_ok(validation.validate_group, value), value


def test_a_remoting_header_beyond_a_declared_limit_answers_the_types_code() -> None:
    top = _int_limits(validation.QueueId)[1]
    longest = _str_limits(validation.TopicName)[1]
    assert decode_header({"topic": "t" * min(longest, validation.MAX_TOPIC_LENGTH), "queueId": str(top)},
                         p.QueueRequestHeader).queueId == top
    for ext, code in [({"topic": "T", "queueId": str(top + 1)}, ErrorCode.QUEUE_ID_ILLEGAL),
                      ({"topic": "T", "queueId": "-1"}, ErrorCode.QUEUE_ID_ILLEGAL),
                      ({"topic": "t" * (longest + 1), "queueId": "0"}, ErrorCode.TOPIC_ILLEGAL),
                      ({"topic": "T", "queueId": "x"}, ErrorCode.INVALID_ARGUMENT),  # a wrong type stays so
                      ({"topic": "T"}, ErrorCode.INVALID_ARGUMENT)]:
        with pytest.raises(SparkMQError) as refused:
            decode_header(ext, p.QueueRequestHeader)
        assert refused.value.code is code, (ext, refused.value)


# -- limits enforced over HTTP ------------------------------------------------------------------------------------

def _int_limits(tp: Any) -> tuple[int, int]:
    info = msgspec.inspect.type_info(tp)
    while isinstance(info, msgspec.inspect.Metadata):
        info = info.type
    assert isinstance(info, msgspec.inspect.IntType) and info.ge is not None and info.le is not None, tp
    return info.ge, info.le


def _str_limits(tp: Any) -> tuple[int, int]:
    info = msgspec.inspect.type_info(tp)
    while isinstance(info, msgspec.inspect.Metadata):
        info = info.type
    assert isinstance(info, msgspec.inspect.StrType) and info.max_length is not None, tp
    return info.min_length or 0, info.max_length


def _state(broker: Broker) -> Any:
    """What a refused request must leave as it was: topics, commit log, consumer offsets and groups."""
    return ([(t.topic, t.read_queue_nums, t.write_queue_nums, t.perm) for t in broker.admin_processor.list_topics()],
            broker.admin_processor.info()["commitlog"],
            broker.consumer_processor.query_offsets("contract-cg", None),
            sorted(broker.clients.consumer_groups()))


def _refused(response: Any, code: ErrorCode) -> None:
    assert response.status_code == code.http_status, response.text
    assert response.json()["code"] == code.name, response.text


def test_topic_names_at_and_beyond_the_limit(clients: dict[str, TestClient], broker: Broker) -> None:
    http = clients["broker"]
    longest = _str_limits(contract.TopicName)[1]  # a %RETRY%/%DLQ% topic's; a plain one's is shorter
    plain = "t" * validation.MAX_TOPIC_LENGTH
    assert http.post("/topics", json={"topic": plain, "read_queue_nums": 1, "write_queue_nums": 1}).status_code == 200
    before = _state(broker)
    for topic in ("t" * (validation.MAX_TOPIC_LENGTH + 1), "%RETRY%" + "g" * (longest - 6), "bad topic"):
        _refused(http.post("/topics", json={"topic": topic}), ErrorCode.TOPIC_ILLEGAL)
        _refused(http.post("/consumers/contract-cg/offsets",
                           json={"offsets": [{"topic": topic, "queue_id": 0, "offset": 0}]}), ErrorCode.TOPIC_ILLEGAL)
    _refused(http.get("/topics/" + "t" * (validation.MAX_TOPIC_LENGTH + 1)), ErrorCode.TOPIC_ILLEGAL)
    assert _state(broker) == before


def test_queue_counts_queue_ids_and_offsets_at_and_beyond_their_limits(clients: dict[str, TestClient],
                                                                        broker: Broker) -> None:
    http = clients["broker"]
    most = _int_limits(contract.QueueCount)[1]
    assert http.post("/topics", json={"topic": "Wide", "read_queue_nums": most, "write_queue_nums": most}
                     ).status_code == 200
    before = _state(broker)
    _refused(http.post("/topics", json={"topic": "Wider", "read_queue_nums": most + 1}), ErrorCode.INVALID_ARGUMENT)
    _refused(http.post("/topics", json={"topic": "Wider", "read_queue_nums": 0}), ErrorCode.INVALID_ARGUMENT)

    top_queue = _int_limits(contract.QueueId)[1]
    assert top_queue == most - 1  # a queue id names one of the most queues a topic may have
    top_offset = _int_limits(contract.Offset)[1]
    # At the limits: accepted (a pull beyond the queue's end is an answer, not an error).
    pulled = http.get(f"/topics/Wide/queues/{top_queue}/messages", params={"offset": top_offset})
    assert pulled.status_code == 200, pulled.text
    # Beyond them: the logic's codes, in the path, the query and a body.
    _refused(http.get(f"/topics/Wide/queues/{top_queue + 1}/messages"), ErrorCode.QUEUE_ID_ILLEGAL)
    _refused(http.get("/topics/Wide/queues/0/messages", params={"offset": top_offset + 1}), ErrorCode.OFFSET_ILLEGAL)
    _refused(http.get("/topics/Wide/queues/0/messages", params={"offset": -1}), ErrorCode.OFFSET_ILLEGAL)
    for entry, code in [({"queue_id": top_queue + 1, "offset": 0}, ErrorCode.QUEUE_ID_ILLEGAL),
                        ({"queue_id": -1, "offset": 0}, ErrorCode.QUEUE_ID_ILLEGAL),
                        ({"queue_id": 0, "offset": top_offset + 1}, ErrorCode.OFFSET_ILLEGAL),
                        ({"queue_id": 0, "offset": -1}, ErrorCode.OFFSET_ILLEGAL),
                        ({"queue_id": "0", "offset": 0}, ErrorCode.INVALID_ARGUMENT),  # strict: "0" is no int
                        ({"queue_id": 0, "offset": 0, "extra": 1}, ErrorCode.INVALID_ARGUMENT)]:
        _refused(http.post("/consumers/contract-cg/offsets", json={"offsets": [{"topic": "Wide", **entry}]}), code)
    _refused(http.post("/consumers/contract-cg/offsets/reset", json={"topic": "Wide", "offsets": {"x": 0}}),
             ErrorCode.QUEUE_ID_ILLEGAL)
    _refused(http.post("/consumers/contract-cg/offsets/reset", json={"topic": "Wide", "offsets": {"0": -1}}),
             ErrorCode.OFFSET_ILLEGAL)
    _refused(http.post("/topics/Wide/messages", json={"body": "x", "queue_id": top_queue + 1}),
             ErrorCode.QUEUE_ID_ILLEGAL)
    assert _state(broker) == before
    # The queue id at its limit is a queue of a topic that has the most queues.
    committed = http.post("/consumers/contract-cg/offsets",
                          json={"offsets": [{"topic": "Wide", "queue_id": top_queue, "offset": 0}]})
    assert committed.status_code == 200, committed.text


def test_groups_client_ids_and_pull_sizes_at_and_beyond_their_limits(clients: dict[str, TestClient],
                                                                      broker: Broker) -> None:
    http = clients["broker"]
    group_len, client_len = _str_limits(contract.GroupName)[1], _str_limits(contract.ClientId)[1]
    assert http.post("/clients/heartbeat", json={"client_id": "c" * client_len,
                                                 "producer_groups": ["g" * group_len]}).status_code == 200
    before = _state(broker)
    _refused(http.post("/clients/heartbeat", json={"client_id": "c", "producer_groups": ["g" * (group_len + 1)]}),
             ErrorCode.GROUP_ILLEGAL)
    _refused(http.post("/clients/heartbeat", json={"client_id": "c" * (client_len + 1)}), ErrorCode.INVALID_ARGUMENT)
    _refused(http.post("/clients/heartbeat", json={"client_id": "c", "consumers": [{"group": "bad group"}]}),
             ErrorCode.GROUP_ILLEGAL)
    _refused(http.get(f"/consumers/{'g' * (group_len + 1)}"), ErrorCode.GROUP_ILLEGAL)
    most = _int_limits(contract.PullMax)[1]
    assert http.get("/topics/Wide/queues/0/messages", params={"max": most},
                    headers={"accept": "application/vnd.apache.arrow.stream"}).status_code == 200
    _refused(http.get("/topics/Wide/queues/0/messages", params={"max": most + 1}), ErrorCode.INVALID_ARGUMENT)
    longest_wait = _int_limits(contract.WaitMs)[1]
    _refused(http.get("/consumers/contract-cg/changes", params={"wait_ms": longest_wait + 1}),
             ErrorCode.INVALID_ARGUMENT)
    # At the limit: answered at once, the known version (5) being stale.
    changed = http.get("/consumers/contract-cg/changes", params={"wait_ms": longest_wait, "version": 5})
    assert changed.status_code == 200, changed.text
    _refused(http.get("/topics/Wide/queues/0/messages", params={"filter_type": "XPATH"}),
             ErrorCode.FILTER_EXPRESSION_ILLEGAL)
    assert _state(broker) == before


def test_the_gateway_and_the_name_server_enforce_the_same_declarations(clients: dict[str, TestClient]) -> None:
    top_queue = _int_limits(contract.QueueId)[1]
    gateway = clients["gateway"]
    _refused(gateway.post("/topics/T/messages", json={"body": "x", "queue_id": top_queue + 1}),
             ErrorCode.QUEUE_ID_ILLEGAL)
    _refused(gateway.post("/topics/T/batch", json={"messages": []}), ErrorCode.MESSAGE_ILLEGAL)
    _refused(gateway.post("/topics/" + "t" * (validation.MAX_TOPIC_LENGTH + 1) + "/messages", json={"body": "x"}),
             ErrorCode.TOPIC_ILLEGAL)

    namesrv = clients["namesrv"]
    most = _int_limits(contract.NamesrvQueueCount)[1]
    good = {"cluster": "c", "broker_name": "b", "broker_id": 0, "broker_addr": "127.0.0.1:10911", "data_version": 1}
    topic = {"read_queue_nums": most, "write_queue_nums": most, "perm": 6}
    assert namesrv.post("/brokers/register", json={**good, "topic_configs": {"T": topic}}).status_code == 200
    route = namesrv.get("/routes/T").json()
    _refused(namesrv.post("/brokers/register", json={**good, "data_version": 2,
                                                     "topic_configs": {"T": {**topic, "read_queue_nums": most + 1}}}),
             ErrorCode.INVALID_ARGUMENT)
    _refused(namesrv.post("/brokers/register", json={**good, "data_version": 2,
                                                     "topic_configs": {"t" * 128: topic}}), ErrorCode.TOPIC_ILLEGAL)
    assert namesrv.get("/routes/T").json() == route
