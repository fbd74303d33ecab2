"""The one place the RocketMQ v2 protocol's generated modules are imported from.

Why the wheel's modules (``rocketmq.grpc_protocol`` of ``rocketmq-python-client``) and not our own protoc
output: the wheel registers the protos as ``service.proto`` / ``definition.proto`` in protobuf's global
descriptor pool, so a second generated set of the same messages in one interpreter fails with a
duplicate-symbol error.  Tests and the benchmark run the official client beside a broker in one process;
with one set of modules per process (these) both sides share every message class.  The wheel is a
declared dependency (pyproject), pinned to a tested version set.
"""
from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as definition
from rocketmq.grpc_protocol import service_pb2 as service
from rocketmq.grpc_protocol import service_pb2_grpc as service_grpc

__all__ = ["definition", "service", "service_grpc", "SERVICE_NAME", "Code", "MessageType"]

#: The full gRPC service name the official clients call.
SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
Code = definition.Code
MessageType = definition.MessageType
