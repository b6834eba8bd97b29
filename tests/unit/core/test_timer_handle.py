"""Recall handles (``common/core/timer.py``): RocketMQ 5's ``HandleV1`` text, base64url without
padding; a malformed one is refused naming what is wrong, never half-read."""

from __future__ import annotations

import base64

import pytest

from common.core.timer import RESERVED, RecallHandle, requested
from common.core.transaction import RESERVED as TRANSACTION_RESERVED
from common.format.boundary import broker_only

pytestmark = pytest.mark.unit


def test_a_handle_round_trips_and_reads_as_rocketmq_writes_it() -> None:
    h = RecallHandle("orders", "broker-a", 1_800_000_000_123, "0A1B2C")
    text = h.encode()
    assert "=" not in text and "+" not in text and "/" not in text
    padded = text + "=" * (-len(text) % 4)
    assert base64.urlsafe_b64decode(padded) == b"v1 orders broker-a 1800000000123 0A1B2C"
    assert RecallHandle.decode(text) == h
    assert RecallHandle.decode(padded) == h  # a padded one (a Java client's) reads the same


@pytest.mark.parametrize(("handle", "words"), [
    ("", "1 to 1024"),
    ("x" * 1025, "1 to 1024"),
    ("!!!!", "not base64url"),
    (base64.urlsafe_b64encode(b"\xff\xfe").decode(), "not base64url"),
    (base64.urlsafe_b64encode(b"v2 t b 1 k").decode(), "not a v1 handle"),
    (base64.urlsafe_b64encode(b"v1 t b 1").decode(), "not a v1 handle"),
    (base64.urlsafe_b64encode(b"v1 t b soon k").decode(), "malformed"),
    (base64.urlsafe_b64encode(b"v1 t b -5 k").decode(), "malformed"),
])
def test_a_malformed_handle_is_refused_naming_why(handle: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        RecallHandle.decode(handle)


def test_what_a_producer_asks_for_and_what_only_the_broker_sets() -> None:
    assert requested({"TIMER_DELAY_SEC": "1"}) and requested({"TIMER_DELIVER_MS": "1"})
    assert not requested({"DELAY": "3"})
    assert broker_only({"a": "b"}) is None and broker_only({}) is None
    for name in (*RESERVED, *TRANSACTION_RESERVED):
        assert broker_only({"KEYS": "k", name: "1"}) == name
