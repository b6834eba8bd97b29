"""A SEND / SEND_BATCH answer -> SendResults: msgIds, queue offsets, and malformed answers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from common.client import SendResult, send_results
from common.core.errors import BrokerError, PullStatus, SendStatus
from common.core.message import encode_msg_id
from common.format.protocol import Response, ResponseCode

pytestmark = pytest.mark.unit

HOST = "7F00000100002A9F"


def answer(**fields: Any) -> Response:
    base: dict[str, Any] = {"storeHost": HOST, "queueId": 2, "queueOffset": 40}
    return Response(ResponseCode.SUCCESS, 1, "", {**base, **fields}, [])


@pytest.mark.parametrize("count", [1, 7, 8, 64, 300])
def test_each_result_has_its_offset_msg_id_and_queue_offset(count: int) -> None:
    offsets = [(1 << 40) + 233 * i for i in range(count)]
    fields = {"commitLogOffset": offsets[0]}
    if count > 1:
        fields["offsets"] = offsets
    results = send_results("orders", answer(**fields))
    assert [r.commit_log_offset for r in results] == offsets
    assert [r.queue_offset for r in results] == list(range(40, 40 + count))
    ip, port = bytes.fromhex(HOST[:8]), int(HOST[8:], 16)
    assert [r.msg_id for r in results] == [encode_msg_id(ip, port, o) for o in offsets]
    first = results[0]
    assert isinstance(first, SendResult) and first == SendResult(
        SendStatus.SEND_OK, first.msg_id, 2, 40, offsets[0], "orders")
    assert first.to_json()["msgId"] == first.msg_id
    # the contract's names compare as written, and the members stay what they were
    assert first.status == "SEND_OK" and first.status is SendStatus.SEND_OK
    assert first.status != "FLUSH_SLAVE_TIMEOUT" and PullStatus.NO_NEW_MSG == "NO_NEW_MSG"
    assert f"{first.status}" == "SEND_OK" and json.dumps(first.status) == '"SEND_OK"'


@pytest.mark.parametrize(
    "fields",
    [
        {"offsets": [1, 2, "3", 4, 5, 6, 7, 8]},
        {"offsets": [1, 2, 3, 4, 5, 6, 7, -8]},
        {"offsets": [1, 2, 3, 4, 5, 6, 7, 1 << 64]},
        {"offsets": [1, 2, 3, 4, 5, 6, 7, True]},
        {"storeHost": "short", "commitLogOffset": 5},
        {"storeHost": None, "commitLogOffset": 5},
    ],
    ids=["str-offset", "negative", "too-big", "bool", "short-host", "no-host"],
)
def test_a_malformed_answer_is_a_system_error_not_a_crash(fields: dict[str, Any]) -> None:
    with pytest.raises(BrokerError) as err:
        send_results("orders", answer(**fields))
    assert err.value.code is ResponseCode.SYSTEM_ERROR


def _records(n: int) -> list[bytes]:
    from common.format import record as rec

    out, phy = [], 0
    for i in range(n):
        raw = rec.encode(b"t", b"body%d" % i, b"", 0, queue_offset=10 + i, phy_offset=phy)
        out.append(bytes(raw))
        phy += len(raw)
    return out


def _pull_answer(bodies: list[bytes]) -> Response:
    fields = {"status": "FOUND", "nextBeginOffset": 10 + len(bodies), "minOffset": 0,
              "maxOffset": 99}
    return Response(ResponseCode.SUCCESS, 1, "", fields, bodies)


def test_a_corrupt_record_ends_a_pull_and_is_then_named() -> None:
    """It used to fail the whole batch ("corrupt record in answer"), so no pull of that queue
    could return the good messages before it, nor say which one was bad."""
    from common.client import pull_result
    from common.core.errors import CorruptMessageError

    good = _records(5)
    bad = bytearray(good[3])
    bad[88] ^= 0x01  # the first body byte: only the CRC can tell
    pr = pull_result(_pull_answer([*good[:3], bytes(bad), good[4]]))
    assert [m.queue_offset for m in pr.messages] == [10, 11, 12]
    assert pr.next_begin_offset == 13  # the next pull starts at the bad one...
    with pytest.raises(CorruptMessageError) as e:
        pull_result(_pull_answer([bytes(bad), good[4]]))  # ... and learns which it is
    assert (e.value.queue_offset, e.value.commit_log_offset) == (13, sum(map(len, good[:3])))
    assert not e.value.retriable and "pull from 14 to skip it" in e.value.remark


def test_the_broker_naming_a_corrupt_record_raises_it_typed() -> None:
    from common.client import pull_result
    from common.core.errors import CorruptMessageError

    resp = Response(ResponseCode.SYSTEM_ERROR, 1, "corrupt record at queue offset 7 ...",
                    {"corruptQueueOffset": 7, "corruptCommitLogOffset": 4096}, [])
    with pytest.raises(CorruptMessageError) as e:
        pull_result(resp)
    assert (e.value.queue_offset, e.value.commit_log_offset) == (7, 4096)
