"""RocketMQ 5's gRPC protocol (``apache.rocketmq.v2.MessagingService``) as one more adapter over the broker's
processors, so the official RocketMQ 5 clients (Java, Go, Python, ...) use a sparkmq broker unchanged.

- :mod:`.server` -- :class:`GrpcServer`, started by the broker runner beside remoting (``grpc_port``).
- :mod:`.servicer` -- the RPCs: decode, call a processor, encode.
- :mod:`.convert` -- v2 messages <-> sparkmq's message model, error codes -> v2 status codes, namespaces.
- :mod:`.routes` -- QueryRoute / QueryAssignment from the name servers' routes.
- :mod:`.clients` -- Telemetry sessions, the settings handshake, check-backs pushed to producers.
- :mod:`.renewals` -- auto-renewed receipt handles of push consumers.
"""
import os

# gRPC's fork handlers (on by default in grpcio) run on every fork() of this process.  The broker forks
# only to exec (PySpark launches the lake's JVM with a preexec_fn, which forces a real fork), and with the
# server's threads busy those handlers can hang the parent in Popen or the child before exec: the lake
# then never starts.  Nothing here needs gRPC in a forked child, so turn them off before grpc loads.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from .server import GrpcServer  # noqa: E402

__all__ = ["GrpcServer"]
