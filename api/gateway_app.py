"""The standalone gateway: the HTTP front door that routes sends over the name servers' routes.

It accepts exactly the broker's send requests (``POST /topics/{topic}/messages`` and
``/batch``, JSON or Arrow; see ``docs/http-api.md``) and sends them with a
:class:`~sparkmq.platform.client.producer.Producer`: round-robin over the write queues
of every broker, a failing broker avoided for a while, 2 retries elsewhere.  A plain
HTTP client therefore never needs to know the topology.  The gateway keeps no state:
run as many as you like behind a load balancer.

In the embedded default (``sparkmq dev``) the broker's own app serves these endpoints.

Access control (docs/security.md): with a guard whose ACL is on, every request but ``/health`` and the API docs
must be signed by a user of the gateway's own ACL (``<data_dir>/config/acl.json``, managed over the same
``/acl/*`` endpoints as a broker's) with ``Pub`` on the topic (:data:`GATEWAY_NEEDS`); it is checked before
anything is forwarded.  The gateway then sends as itself: its producer signs with the gateway's configured
credentials, which the brokers and name servers check in their turn.
"""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.concurrency import run_in_threadpool

from ..platform.auth import AccessGuard, Action, Need, Resource
from ..platform.broker.processors import OutgoingMessage
from ..platform.client.producer import Producer, SendResult
from ..platform.common import wire
from ..platform.common.errors import ErrorCode, SparkMQError
from ..platform.common.http_contract import BatchSendBody
from ..platform.common.message import PROPERTY_UNIQUE_ID, Message
from .acl import OPEN, SIGNED, NeedsOf, acl_router, http_access
from .broker_app import BATCH_SEND_OPENAPI, SendBody, outgoing_from_arrow, outgoing_from_json
from .console.docs import install_docs
from .errors import install_error_handlers
from .params import NonEmpty, QueueId, TopicName, decode_body, install_bodies

__all__ = ["create_app", "GATEWAY_PRODUCER_GROUP", "GATEWAY_NEEDS"]

log = logging.getLogger("sparkmq.gateway")

#: The producer group the gateway's sends carry unless a request names one.
GATEWAY_PRODUCER_GROUP = "SPARKMQ_GATEWAY"
#: Largest request body accepted (as the broker).
MAX_REQUEST_BYTES = 64 << 20


def _producer(request: Request) -> Producer:
    return request.app.state.producer


ProducerDep = Annotated[Producer, Depends(_producer)]
router = APIRouter(tags=["send"])
_TopicPath = Annotated[TopicName, Path(description="topic name (percent-encode % and |)")]


def _message(topic: str, item: OutgoingMessage) -> Message:
    props = dict(item.properties)
    if item.msg_id:
        props[PROPERTY_UNIQUE_ID] = item.msg_id
    return Message(topic, item.body, tags=item.tags, keys=tuple(item.keys), properties=props)


def _result(result: SendResult) -> dict[str, Any]:
    return {"status": str(result.status), "msg_id": result.msg_id, "offset_msg_id": result.offset_msg_id,
            "topic": result.topic, "broker_name": result.broker_name, "queue_id": result.queue_id,
            "queue_offset": result.queue_offset, "store_timestamp": result.store_timestamp}


def _no_queue_id(queue_id: int | None) -> None:
    if queue_id is not None:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                           "the gateway picks queues across brokers; send a sharding_key to keep messages in order")


@router.post("/topics/{topic}/messages")
async def send_message(topic: _TopicPath, body: SendBody, producer: ProducerDep) -> dict[str, Any]:
    """Send one message to some broker serving ``topic``; answers where it was stored."""
    _no_queue_id(body.queue_id)
    message = _message(topic, outgoing_from_json(body))
    result = await run_in_threadpool(producer.send, message, sharding_key=body.sharding_key)
    return _result(result)


@router.post("/topics/{topic}/batch", openapi_extra=BATCH_SEND_OPENAPI)
async def send_batch(topic: _TopicPath, request: Request, producer: ProducerDep,
                     queue_id: Annotated[QueueId | None, Query(description="not allowed: the gateway picks")] = None,
                     sharding_key: NonEmpty | None = None) -> dict[str, Any]:
    """Send many messages of one topic to one queue of some broker (JSON or Arrow, as the broker accepts)."""
    _no_queue_id(queue_id)
    raw = await request.body()
    if len(raw) > MAX_REQUEST_BYTES:
        raise SparkMQError(ErrorCode.MESSAGE_TOO_LARGE, f"the request is {len(raw)} bytes, "
                                                        f"the limit is {MAX_REQUEST_BYTES}")
    if request.headers.get("content-type", "").split(";")[0].strip() == wire.ARROW_STREAM:
        items = outgoing_from_arrow(raw)
    else:
        items = [outgoing_from_json(m) for m in decode_body(BatchSendBody, raw).messages]
    messages = [_message(topic, item) for item in items]
    results = await run_in_threadpool(producer.send_batch, messages, sharding_key=sharding_key)
    first = results[0]
    return {"status": str(first.status), "topic": first.topic, "broker_name": first.broker_name,
            "queue_id": first.queue_id,
            "results": [{"msg_id": r.msg_id, "offset_msg_id": r.offset_msg_id, "queue_offset": r.queue_offset}
                        for r in results]}


@router.get("/routes/{topic}", tags=["routes"])
async def route(topic: _TopicPath, producer: ProducerDep) -> dict[str, Any]:
    """The write queues the gateway sends ``topic`` to (from the name servers)."""
    info = await run_in_threadpool(producer.route, topic)
    return {"topic": topic, "write_queues": [{"broker_name": q.broker_name, "queue_id": q.queue_id}
                                             for q in info.write_queues]}


@router.get("/health", tags=["health"])
async def health(producer: ProducerDep) -> dict[str, Any]:
    """Liveness, with the name servers the gateway routes over."""
    return {"status": "ok", "namesrv_addrs": list(producer.config.namesrv_addrs)}


def _pub_on_topic(path: dict[str, Any], query: dict[str, Any], body: Any) -> list[Need]:
    return [(Action.PUB, Resource.topic(path.get("topic", "")))]


#: (method, route path) -> what a caller needs while the gateway's ACL is on; ``/acl/*`` needs a super user.
GATEWAY_NEEDS: dict[tuple[str, str], str | NeedsOf] = {
    ("GET", "/health"): OPEN,
    ("GET", "/docs"): OPEN,
    ("GET", "/acl/whoami"): SIGNED,  # any signed user asks who it is (the console)
    ("POST", "/topics/{topic}/messages"): _pub_on_topic,
    ("POST", "/topics/{topic}/batch"): _pub_on_topic,
    ("GET", "/routes/{topic}"): _pub_on_topic,
}


def create_app(producer: Producer, guard: AccessGuard | None = None) -> FastAPI:
    """The gateway app over a started-on-lifespan ``producer`` (shut down with the app).

    ``guard``: the gateway's own access guard (its ACL and the ``/acl`` API); None = open, no ``/acl`` API.
    """

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        producer.start()
        try:
            yield
        finally:
            await run_in_threadpool(producer.shutdown)

    app = FastAPI(title="sparkmq gateway", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Sends routed over the name servers' routes; same requests as a broker's send API.",
                  dependencies=[Depends(http_access)])
    app.state.producer = producer
    app.state.guard = guard
    app.state.route_needs = GATEWAY_NEEDS
    app.state.max_request_bytes = MAX_REQUEST_BYTES
    app.include_router(router)
    if guard is not None:
        app.include_router(acl_router)
    install_docs(app)
    install_bodies(app, BatchSendBody)
    install_error_handlers(app, log)
    return app
