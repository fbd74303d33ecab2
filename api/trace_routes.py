"""Message trace endpoints of the broker (``docs/http-api.md``, "Message trace").

* ``POST /trace`` ``{"events": [...]}``: clients post their ``send`` / ``consume`` events; the
  broker validates every one (a bad event is INVALID_ARGUMENT and nothing is recorded) and
  buffers them for ``RMQ_SYS_TRACE_TOPIC``.
* ``GET /trace/{msg_id}``: the message's path from this broker's ``message_trace`` table, in
  time order, with the elapsed milliseconds between steps.  ``AdminClient.trace`` merges the
  answers of every master.

Included by :func:`sparkmq.api.broker_app.create_app`.
"""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from ..platform.broker.broker import Broker
from ..platform.common.http_contract import TraceBody
from .params import json_body

__all__ = ["trace_router", "TraceBody"]

trace_router = APIRouter(tags=["trace"])


def _broker(request: Request) -> Broker:
    return request.app.state.broker


@trace_router.post("/trace")
def post_trace(body: Annotated[TraceBody, Depends(json_body(TraceBody))], request: Request) -> dict[str, Any]:
    """Record client trace events; ``accepted`` is 0 when tracing is off on this broker (``enabled`` false)."""
    return _broker(request).query_processor.record_trace(body.events)


@trace_router.get("/trace/{msg_id}")
def get_trace(msg_id: str, request: Request) -> dict[str, Any]:
    """The message's trace events from this broker's lake, ordered, each with ``elapsed_ms`` and
    ``since_first_ms``; ``events`` is empty until the trace job has written them (or without a lake)."""
    return _broker(request).query_processor.trace(msg_id)
