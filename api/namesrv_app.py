"""The name server's HTTP API: broker registration, routes, topics, cluster view.

Build it with :func:`create_app`; ``sparkmq.api.namesrv_main`` serves it with uvicorn.
Every error answers ``{"code": CODE, "message": ...}`` with the code's HTTP status.

With ``acl_enabled`` every route but ``/health`` and the API docs needs a signed request whose user may do what
:data:`NAMESRV_NEEDS` says (the broker's :func:`~sparkmq.api.acl.http_access` over the name server's own
:class:`~sparkmq.platform.auth.AccessGuard`); users and policies live in ``<data_dir>/config/acl.json`` and are
managed over the same ``/acl/*`` endpoints as a broker's (docs/security.md).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request

from ..platform.auth import CLUSTER, AccessGuard, Action, Need, Resource
from ..platform.common.errors import ErrorCode, SparkMQError
from ..platform.common.http_contract import RegisterBrokerRequest, TopicConfigBody, UnregisterBrokerRequest
from ..platform.namesrv import NameServerConfig, RouteTable, TopicConfig
from .acl import OPEN, SIGNED, AnyOf, NeedsOf, Params, acl_router, http_access
from .console.docs import install_docs
from .errors import install_error_handlers
from .params import ClusterName, TopicName, install_bodies, json_body

__all__ = ["create_app", "namesrv_guard", "NAMESRV_NEEDS", "RegisterBrokerRequest", "UnregisterBrokerRequest",
           "TopicConfigBody"]

log = logging.getLogger("sparkmq.namesrv")


# -- request bodies ---------------------------------------------------------------------
# Defined once, with their limits, in platform/common/http_contract.py (the route table checks the same ones for
# every caller); decoded by msgspec (api/params.py) and documented from the same definitions.
RegisterIn = Annotated[RegisterBrokerRequest, Depends(json_body(RegisterBrokerRequest))]
UnregisterIn = Annotated[UnregisterBrokerRequest, Depends(json_body(UnregisterBrokerRequest))]


#: Largest signed request body read for its signature (a registration with 10k topics is about 1 MiB).
_MAX_REQUEST_BYTES = 16 << 20


# -- dependencies -----------------------------------------------------------------------

def _route_table(request: Request) -> RouteTable:
    return request.app.state.route_table


RouteTableDep = Annotated[RouteTable, Depends(_route_table)]


# -- routers ----------------------------------------------------------------------------

brokers_router = APIRouter(prefix="/brokers", tags=["brokers"])
routes_router = APIRouter(tags=["routes"])


@brokers_router.post("/register")
async def register_broker(body: RegisterIn, table: RouteTableDep) -> dict[str, Any]:
    """Register a broker or refresh its heartbeat; answers whether anything changed and the master's addresses."""
    configs = {topic: TopicConfig(**msgspec.structs.asdict(cfg)) for topic, cfg in body.topic_configs.items()}
    changed = table.register_broker(body.cluster, body.broker_name, body.broker_id, body.broker_addr,
                                    body.ha_addr, body.data_version, configs, remoting_addr=body.remoting_addr,
                                    epoch=body.epoch, grpc_addr=body.grpc_addr)
    data = table.broker_data(body.broker_name)
    master = data.master_addr if data else None
    return {"changed": changed, "master_addr": master,
            "master_ha_addr": data.ha_addrs.get(0) if data and master else None}


@brokers_router.post("/unregister")
async def unregister_broker(body: UnregisterIn, table: RouteTableDep) -> dict[str, bool]:
    """Remove a broker address that is shutting down; ``removed`` is false if it was not registered as given."""
    return {"removed": table.unregister_broker(body.cluster, body.broker_name, body.broker_id, body.broker_addr)}


@routes_router.get("/routes/{topic}", tags=["routes"])
async def topic_route(topic: Annotated[TopicName, Path()], table: RouteTableDep) -> dict[str, Any]:
    """The topic's route: queue data per broker name and those brokers' addresses (404 TOPIC_NOT_EXIST)."""
    route = table.topic_route(topic)
    if route is None:
        raise SparkMQError(ErrorCode.TOPIC_NOT_EXIST, f"no live broker serves topic {topic!r}")
    return route.to_dict()


@routes_router.get("/topics", tags=["topics"])
async def topic_list(table: RouteTableDep) -> dict[str, list[str]]:
    """Every topic some live broker serves, sorted."""
    return {"topics": table.topic_list()}


@routes_router.delete("/topics/{topic}", tags=["topics"])
async def delete_topic(topic: Annotated[TopicName, Path()], table: RouteTableDep,
                       cluster: Annotated[ClusterName | None, Query(description="only this cluster's brokers")] = None,
                       ) -> dict[str, Any]:
    """Forget a topic's routes (brokers re-add it when their data version changes); idempotent."""
    return {"topic": topic, "deleted": table.delete_topic(topic, cluster)}


@routes_router.get("/cluster", tags=["cluster"])
async def cluster_info(table: RouteTableDep) -> dict[str, Any]:
    """Clusters with their broker names, broker addresses by id, and live broker addresses."""
    return table.cluster_info().to_dict()


@routes_router.get("/health", tags=["health"])
async def health(table: RouteTableDep) -> dict[str, Any]:
    """Liveness, with the number of live broker addresses and topics."""
    info = table.cluster_info()
    return {"status": "ok", "live_brokers": len(info.live_brokers), "topics": len(table.topic_list())}


# -- access control ---------------------------------------------------------------------

def _on_cluster(action: Action) -> NeedsOf:
    return lambda path, query, body: [(action, CLUSTER)]


def _on_topic(action: Action) -> NeedsOf:
    return lambda path, query, body: [(action, Resource.topic(path.get("topic", "")))]


def _route_lookup(path: Params, query: Params, body: Any) -> list[Need]:
    """A route is what a producer (Pub) or a consumer (Sub) of the topic needs, or an admin (Get) reads."""
    topic = Resource.topic(path.get("topic", ""))
    return AnyOf([(Action.PUB, topic), (Action.SUB, topic), (Action.GET, topic)])


#: (method, route path) -> what a request needs while ACL is on; routes not listed (``/acl/*``) need a super
#: user.  Registering and unregistering brokers need ``Update`` on ``Cluster``: give it to the brokers' user
#: (their ``acl_super_user_*``), not to applications.  Forgetting a topic needs ``Delete`` on it, as deleting it
#: at a broker does (RocketMQ ACL 2.0), so one policy lets ``sparkmq admin topic delete`` do both.
NAMESRV_NEEDS: dict[tuple[str, str], str | NeedsOf] = {
    ("GET", "/health"): OPEN,
    ("GET", "/docs"): OPEN,
    ("GET", "/acl/whoami"): SIGNED,  # any signed user asks who it is (the console)
    ("POST", "/brokers/register"): _on_cluster(Action.UPDATE),
    ("POST", "/brokers/unregister"): _on_cluster(Action.UPDATE),
    ("GET", "/routes/{topic}"): _route_lookup,
    ("GET", "/topics"): _on_cluster(Action.LIST),
    ("GET", "/cluster"): _on_cluster(Action.LIST),
    ("DELETE", "/topics/{topic}"): _on_topic(Action.DELETE),
}


def namesrv_guard(config: NameServerConfig) -> AccessGuard | None:
    """The name server's access guard over ``<data_dir>/config/acl.json``; None without a data dir (then ACL is
    off, which the config guarantees, and there is no ``/acl`` API: nowhere to keep users)."""
    if not config.data_dir:
        return None
    return AccessGuard.open(config.data_dir, enabled=config.acl_enabled,
                            super_user_access_key=config.acl_super_user_access_key,
                            super_user_secret_key=config.acl_super_user_secret_key,
                            clock_skew_s=config.acl_clock_skew_s)


# -- the app ----------------------------------------------------------------------------

async def _scan_loop(table: RouteTable, interval_s: float) -> None:
    """Drop silent brokers every ``interval_s`` (RocketMQ's scanNotActiveBroker)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            table.scan_expired()
        except Exception:  # keep scanning: one bad pass must not leave dead brokers in routes forever
            log.exception("broker expiry scan failed")


def create_app(route_table: RouteTable, config: NameServerConfig) -> FastAPI:
    """The name server app over ``route_table``; its lifespan runs the expiry scan every ``config.scan_interval_s``.

    Example::

        >>> app = create_app(RouteTable(), NameServerConfig())
        >>> sorted(r.path for r in app.routes if r.path.startswith("/brokers"))
        ['/brokers/register', '/brokers/unregister']
    """

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_scan_loop(route_table, config.scan_interval_s), name="namesrv-expiry-scan")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # With ACL on, every route is authenticated and authorized before it runs (api/acl.py, docs/security.md).
    app = FastAPI(title="sparkmq name server", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Broker registration and expiry, topic routes, cluster view.",
                  dependencies=[Depends(http_access)])
    app.state.route_table = route_table
    app.state.config = config
    app.state.guard = namesrv_guard(config)
    app.state.route_needs = NAMESRV_NEEDS
    app.state.max_request_bytes = _MAX_REQUEST_BYTES
    app.include_router(brokers_router)
    app.include_router(routes_router)
    if app.state.guard is not None:
        app.include_router(acl_router)
    install_docs(app)
    install_bodies(app)
    install_error_handlers(app, log)
    return app
