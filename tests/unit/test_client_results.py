"""A SEND / SEND_BATCH answer -> SendResults: msgIds, queue offsets, and malformed answers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from common.client import SendResult, send_results
from common.errors import BrokerError, PullStatus, SendStatus
from common.message import encode_msg_id
from common.protocol import Response, ResponseCode

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
