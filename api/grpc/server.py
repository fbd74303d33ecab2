"""The broker's gRPC endpoint: a ``grpc.aio`` server on the broker's event loop, beside remoting."""
from __future__ import annotations

import asyncio
import logging

import grpc

from ...platform.broker.broker import Broker
from .clients import ClientRegistry
from .renewals import Renewals
from .routes import RouteResolver
from .servicer import MessagingService

__all__ = ["GrpcServer"]

log = logging.getLogger("sparkmq.broker.grpc")

#: A request may be this large: a 64-message batch of 4 MiB bodies fits (the store refuses bigger bodies).
_MAX_MESSAGE_BYTES = 320 << 20


class GrpcServer:
    """Serves ``apache.rocketmq.v2.MessagingService`` for one broker on its own port (TLS when the broker has a
    certificate: the official clients' ``tls_enable``).

    Example (inside the serving loop)::

        server = await GrpcServer(broker).start("127.0.0.1", 8081)
        broker.grpc_addr = f"127.0.0.1:{server.port}"
        ...
        await server.stop()
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.clients = ClientRegistry(broker, max_body_size=broker.send_processor.max_message_size)
        self.routes = RouteResolver(broker.config.namesrv_addrs, tls=broker.config.tls,
                                    credentials=broker.config.namesrv_credentials)
        self.renewals = Renewals(broker)
        self.service = MessagingService(broker, self.clients, self.routes, self.renewals)
        self._server: grpc.aio.Server | None = None
        self.port = 0
        # A check-back offered for a topic's group goes to a live gRPC producer of that topic (any thread).
        broker.checks.add_offer_listener(lambda group: self.clients.push_pending_checks((group,)))

    async def start(self, host: str, port: int) -> GrpcServer:
        """Listen on ``host:port`` (0 = a free port) on the running loop; OSError when it cannot bind."""
        self.clients.bind_loop(asyncio.get_running_loop())
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
                   ("grpc.so_reuseport", 0)]  # a taken port must fail, not be shared
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((self.service.handler(),))
        tls = self.broker.config.tls
        if tls.enabled:  # gRPC cannot share a port between TLS and plaintext: with a certificate, TLS only
            credentials = grpc.ssl_server_credentials([tls.key_pair()])
            bound = server.add_secure_port(f"{host}:{port}", credentials)
        else:
            bound = server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise OSError(f"cannot listen for gRPC on {host}:{port}")
        await server.start()
        self._server, self.port = server, bound
        self.renewals.start()
        log.info("broker %s serves gRPC on %s:%d", self.broker.name, host, bound)
        return self

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting calls, give those in flight ``grace_s``, then close."""
        await self.renewals.stop()
        if self._server is not None:
            await self._server.stop(grace_s)
        await self.routes.close()
