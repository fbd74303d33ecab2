"""RocketMQ 5's gRPC protocol (``apache.rocketmq.v2.MessagingService``) as one more adapter over the broker's
processors, so the official RocketMQ 5 clients (Java, Go, Python, ...) use a sparkmq broker unchanged.

- :mod:`.server` -- :class:`GrpcServer`, started by the broker runner beside remoting (``grpc_port``).
- :mod:`.servicer` -- the RPCs: decode, call a processor, encode.
- :mod:`.convert` -- v2 messages <-> sparkmq's message model, error codes -> v2 status codes, namespaces.
- :mod:`.routes` -- QueryRoute / QueryAssignment from the name servers' routes.
- :mod:`.clients` -- Telemetry sessions, the settings handshake, check-backs pushed to producers.
- :mod:`.renewals` -- auto-renewed receipt handles of push consumers.
"""
from .server import GrpcServer

__all__ = ["GrpcServer"]
