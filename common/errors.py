"""``common.errors``, the path user code imports statuses, codes and ``BrokerError`` from.

They live in ``common/core/errors.py``; this module keeps the public import path working."""

from common.core.errors import (
    RETRIABLE_CODES,
    BrokerError,
    ConfigError,
    CorruptionError,
    CorruptMessageError,
    GetStatus,
    PullStatus,
    PutStatus,
    ResponseCode,
    SendStatus,
    StoreError,
)

__all__ = [
    "RETRIABLE_CODES",
    "BrokerError",
    "ConfigError",
    "CorruptMessageError",
    "CorruptionError",
    "GetStatus",
    "PullStatus",
    "PutStatus",
    "ResponseCode",
    "SendStatus",
    "StoreError",
]
