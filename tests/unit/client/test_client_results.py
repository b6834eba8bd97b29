"""A SEND / SEND_BATCH answer -> SendResults: msgIds, queue offsets, and malformed answers;
each case with the C loop (``_codec.send_results``, where built) and the Python reference, and
the two held to the same results on random answers."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from common.client import SendResult, results, send_results
from common.core.errors import BrokerError, PullStatus, SendStatus
from common.core.message import encode_msg_id
from common.format.protocol import Response, ResponseCode

pytestmark = pytest.mark.unit

HOST = "7F00000100002A9F"
NATIVE = results._native_results


@pytest.fixture(params=["native", "python"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "native":
        if NATIVE is None:
            pytest.skip("the C codec is not built")
    else:
        monkeypatch.setattr(results, "_native_results", None)
    yield request.param


def answer(**fields: Any) -> Response:
    base: dict[str, Any] = {"storeHost": HOST, "queueId": 2, "queueOffset": 40}
    return Response(ResponseCode.SUCCESS, 1, "", {**base, **fields}, [])


@pytest.mark.parametrize("count", [1, 7, 8, 64, 300])
def test_each_result_has_its_offset_msg_id_and_queue_offset(count: int, path: str) -> None:
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
def test_a_malformed_answer_is_a_system_error_not_a_crash(fields: dict[str, Any],
                                                          path: str) -> None:
    with pytest.raises(BrokerError) as err:
        send_results("orders", answer(**fields))
    assert err.value.code is ResponseCode.SYSTEM_ERROR


@pytest.mark.skipif(NATIVE is None, reason="the C codec is not built")
def test_the_c_loop_makes_what_the_python_one_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    """500 random answers, near the edges (offsets 0 and 2**63 - 1, one message and many, a
    recall handle, a broker name, a queue offset near 2**63, a bad offset among good ones,
    a prefix that is not ASCII): the same SendResults, field for field and type for type, or
    the same error."""
    rng = random.Random(43)

    def outcome(resp: Response, use_c: bool) -> Any:
        monkeypatch.setattr(results, "_native_results", NATIVE if use_c else None)
        try:
            out = send_results("t", resp, "broker-x")
        except BrokerError as e:
            return ("error", e.code, str(e))
        return [(type(r), tuple(r), [type(v) for v in r]) for r in out]

    for _ in range(500):
        n = rng.choice([1, 2, 7, 8, 9, 64, 200])
        offsets: list[Any] = [rng.choice([0, (1 << 63) - 1, rng.randrange(1 << 63)])
                              for _ in range(n)]
        fields: dict[str, Any] = {"storeHost": HOST, "queueId": rng.randrange(16),
                                  "queueOffset": rng.choice([0, 40, (1 << 63) - n,
                                                             (1 << 63) - 1])}
        if rng.random() < 0.2:
            offsets[rng.randrange(n)] = rng.choice([-1, 1 << 63, "7", 1.5, True, None])
        if rng.random() < 0.1:
            fields["storeHost"] = "7F0000010000\u00e9A9F"
        if rng.random() < 0.3:
            fields["recallHandle"] = f"handle-{rng.randrange(100)}"
        if n == 1 and rng.random() < 0.5:
            fields["commitLogOffset"] = offsets[0]
        else:
            fields["offsets"] = offsets
        resp = Response(ResponseCode.SUCCESS, 1, "", fields, [])
        assert outcome(resp, True) == outcome(resp, False), fields


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
