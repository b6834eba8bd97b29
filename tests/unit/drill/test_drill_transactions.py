"""The drill's transaction checker (common/drill/transactions.py): each figure it must keep at 0
is raised by the history that shows its fault, and a clean history raises none; the worker's
decisions are made once, and a check-back for a half whose local transaction never ran is
answered ROLLBACK."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from common.client import TransactionState
from common.core.message import MessageExt
from common.drill.history import History, make_body
from common.drill.transactions import (
    TX_CONSUMER,
    TransactionWorker,
    check_transactions,
    committed_ids,
    tx_problems,
)

pytestmark = pytest.mark.unit


def ev(t: float, op: str, type_: str, msg_id: str, **more: Any) -> dict[str, Any]:
    return {"t": t, "proc": more.pop("proc", "t0"), "op": op, "type": type_,
            "msg_id": msg_id, **more}


def tx(msg_id: str, t: float, decision: str, half: str = "ok",
       end: str | None = "ok") -> list[dict[str, Any]]:
    out = [ev(t, "tx", "invoke", msg_id),
           ev(t + 0.01, "tx", half, msg_id, phase="half", status="SEND_OK"),
           ev(t + 0.02, "decide", "info", msg_id, status=decision)]
    if end is not None:
        out.append(ev(t + 0.03, "tx", end, msg_id, phase="end", status=decision))
    return out


def read(msg_id: str, t: float) -> dict[str, Any]:
    return ev(t, "get", "ok", msg_id, proc=TX_CONSUMER, status="FOUND")


def drained(*ids: str) -> dict[Any, list[tuple[int, str, bool]]]:
    return {0: [(i, m, True) for i, m in enumerate(ids)]}


CLEAN = tx("t0-1", 1.0, "COMMIT") + tx("t0-2", 2.0, "ROLLBACK") + \
    tx("t0-3", 3.0, "COMMIT", end=None) + [read("t0-1", 1.5), read("t0-3", 9.0)]


def test_a_clean_history_has_no_problem() -> None:
    figures = check_transactions(CLEAN, drained("t0-1", "t0-3"))
    assert tx_problems(figures) == []
    assert figures["tx_attempted"] == 3 and figures["tx_committed"] == 2
    assert figures["tx_rolled_back"] == 1 and figures["tx_consumed"] == 2


@pytest.mark.parametrize(("events", "final", "figure"), [
    (CLEAN + [read("t0-2", 4.0)], drained("t0-1", "t0-3"), "tx_rolled_back_consumed"),
    (CLEAN, drained("t0-1", "t0-2", "t0-3"), "tx_rolled_back_consumed"),
    (CLEAN, drained("t0-1"), "tx_committed_lost"),
    (CLEAN + [read("t0-4", 3.5)] + tx("t0-4", 5.0, "COMMIT"), drained("t0-1", "t0-3", "t0-4"),
     "tx_consumed_before_commit"),
    (CLEAN, drained("t0-1", "t0-3", "t0-3"), "tx_both"),
    (CLEAN + tx("t0-5", 6.0, "COMMIT", end="conflict"), drained("t0-1", "t0-3", "t0-5"),
     "tx_both"),
])
def test_each_fault_raises_its_figure(events: list[dict[str, Any]],
                                      final: dict[Any, list[tuple[int, str, bool]]],
                                      figure: str) -> None:
    figures = check_transactions(events, final)
    assert figures[figure] == 1, figures
    assert tx_problems(figures) == [f"{figure}=1"]


def test_a_half_not_acknowledged_need_not_be_consumed_but_must_not_be_if_rolled_back() -> None:
    events = tx("t0-9", 1.0, "COMMIT", half="info", end=None)
    assert committed_ids(events) == set()
    assert tx_problems(check_transactions(events, drained())) == []
    # a message read that no one decided (its half unsure, never checked): rolled back
    events = [ev(1.0, "tx", "invoke", "t0-8"), read("t0-8", 2.0)]
    assert check_transactions(events, drained("t0-8"))["tx_rolled_back_consumed"] == 1


def test_the_worker_decides_once_and_answers_a_check_for_an_unknown_half_rollback(
        tmp_path: Path) -> None:
    history = History(tmp_path / "h.jsonl")
    try:
        worker = TransactionWorker(history, ["127.0.0.1:1"], "t0", 10.0, "x-tx")
        assert worker.decide("t0-1", TransactionState.COMMIT) is TransactionState.COMMIT
        assert worker.decide("t0-1", TransactionState.ROLLBACK) is TransactionState.COMMIT
        half = MessageExt("RMQ_SYS_TRANS_HALF_TOPIC", 0, 0, 0, 0,
                          make_body("t0-2", 8, random.Random(1)), {})
        assert worker._check(half) is TransactionState.ROLLBACK
        assert worker.decide("t0-2", TransactionState.COMMIT) is TransactionState.ROLLBACK
        decisions = [(e["msg_id"], e["status"]) for e in history.events if e["op"] == "decide"]
        assert decisions == [("t0-1", "COMMIT"), ("t0-2", "ROLLBACK")]
    finally:
        history.close()
