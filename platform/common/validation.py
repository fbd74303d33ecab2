"""Validation of names and sizes, shared by the store, the broker and the clients.

Limits follow RocketMQ: topic <= 127 characters (retry and DLQ topics <= 255),
group <= 120, characters ``[%|a-zA-Z0-9_-]``, body <= 4 MiB, properties < 32 KiB.
"""
from __future__ import annotations

import re

from .errors import ErrorCode, SparkMQError

__all__ = [
    "MAX_TOPIC_LENGTH",
    "MAX_SYSTEM_TOPIC_LENGTH",
    "MAX_GROUP_LENGTH",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MAX_PROPERTIES_SIZE",
    "NAME_CHARS",
    "SYSTEM_TOPIC_PREFIXES",
    "validate_topic",
    "validate_group",
]

MAX_TOPIC_LENGTH = 127
MAX_SYSTEM_TOPIC_LENGTH = 255
MAX_GROUP_LENGTH = 120
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
DEFAULT_MAX_PROPERTIES_SIZE = 32767

#: The characters of topic and group names (a regular-expression character class).
NAME_CHARS = "[%|a-zA-Z0-9_-]"
#: Topics with these prefixes (retry and dead-letter topics) may be MAX_SYSTEM_TOPIC_LENGTH long.
SYSTEM_TOPIC_PREFIXES = ("%RETRY%", "%DLQ%")

# fullmatch, not match with $: "$" also matches before a trailing newline.
_NAME_CHARS = re.compile(f"{NAME_CHARS}+")
_RETRY_OR_DLQ = SYSTEM_TOPIC_PREFIXES


def validate_topic(topic: object) -> str:
    """Return ``topic`` if it is a legal topic name, else raise TOPIC_ILLEGAL."""
    if not isinstance(topic, str) or not topic:
        raise SparkMQError(ErrorCode.TOPIC_ILLEGAL, "the topic must be a non-empty string")
    limit = MAX_SYSTEM_TOPIC_LENGTH if topic.startswith(_RETRY_OR_DLQ) else MAX_TOPIC_LENGTH
    if len(topic) > limit:
        raise SparkMQError(ErrorCode.TOPIC_ILLEGAL, f"the topic is {len(topic)} characters, the limit is {limit}")
    if not _NAME_CHARS.fullmatch(topic):
        raise SparkMQError(ErrorCode.TOPIC_ILLEGAL, f"the topic {topic!r} has characters outside [%|a-zA-Z0-9_-]")
    return topic


def validate_group(group: object) -> str:
    """Return ``group`` if it is a legal group name, else raise GROUP_ILLEGAL."""
    if not isinstance(group, str) or not group:
        raise SparkMQError(ErrorCode.GROUP_ILLEGAL, "the group must be a non-empty string")
    if len(group) > MAX_GROUP_LENGTH:
        raise SparkMQError(ErrorCode.GROUP_ILLEGAL,
                           f"the group is {len(group)} characters, the limit is {MAX_GROUP_LENGTH}")
    if not _NAME_CHARS.fullmatch(group):
        raise SparkMQError(ErrorCode.GROUP_ILLEGAL, f"the group {group!r} has characters outside [%|a-zA-Z0-9_-]")
    return group
