"""Transactions through a broker on a real store, over real sockets: ``TransactionProducer``'s
half, local transaction and end; the check-back to a live producer of the group when the end
never comes (its producer died between the half and the end); a final state that is final;
``transactionCheckMax``; what a producer may not send."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.brokers import addr, free_port, wait_for

from common.broker.broker import Broker
from common.cli.bootstrap import make_role
from common.cli.main import main
from common.client import Consumer, Producer, TransactionProducer, TransactionState
from common.core.config import load_config
from common.core.errors import BrokerError, ResponseCode
from common.core.message import MessageExt
from common.core.transaction import CHECK_MAX_TOPIC, HALF_ORIGIN, TRANSACTION_COMMIT_TYPE
from common.store.message_store import MessageStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(90)]

COMMIT, ROLLBACK, UNKNOWN = (TransactionState.COMMIT, TransactionState.ROLLBACK,
                             TransactionState.UNKNOWN)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    cfg = load_config(None, (), env={}, listenPort=free_port(), haListenPort=free_port(),
                      storePathRootDir=str(tmp_path / "b"), mappedFileSizeCommitLog=1024 * 1024,
                      transactionCheckInterval=200, transactionTimeOut=300,
                      transactionCheckMax=3, brokerName="tb")
    b = Broker(cfg, MessageStore(cfg), make_role)
    b.start()
    yield b
    b.shutdown()


def read_all(broker: Broker, topic: str, queue_id: int = 0) -> list[Any]:
    with Consumer([addr(broker)], group="g") as c:
        return list(c.pull(topic, queue_id, 0, 64).messages)


def stored(broker: Broker, topic: str) -> list[MessageExt]:
    """A system topic's messages, read in the store (clients may not read it)."""
    store = broker.store
    assert isinstance(store, MessageStore)
    store.reput.catch_up()
    got = store.get_message("g", topic, 0, 0, 64)
    return got.messages() if got.status.name == "FOUND" else []


def by_body(state_of: dict[bytes, TransactionState]) -> Any:
    calls: list[bytes] = []

    def checker(half: MessageExt) -> TransactionState:
        calls.append(half.body)
        return state_of.get(half.body, UNKNOWN)

    checker.calls = calls  # type: ignore[attr-defined]
    return checker


def test_a_committed_transaction_is_consumed_after_its_end_never_before(broker: Broker) -> None:
    seen_during: list[list[Any]] = []

    def local(_half: object) -> TransactionState:
        seen_during.append(read_all(broker, "orders"))
        return COMMIT

    with TransactionProducer([addr(broker)], "pg", by_body({})) as tp:
        result = tp.send_in_transaction("orders", b"paid", local, tags="T", queue_id=0)
    assert result.state is COMMIT and result.end_error is None
    assert seen_during == [[]]
    # Visible once reput dispatched the commit's record: the I/O thread does it after the END's
    # burst unless the reput thread is mid-pass (then that thread does, when it next runs: on
    # a loaded machine, after a pull sent at once can be served), as for any SEND.
    [got] = wait_for(lambda: read_all(broker, "orders"), "the committed message", timeout_s=20)
    assert got.body == b"paid" and got.tags == "T"
    assert got.sys_flag & 0xC == TRANSACTION_COMMIT_TYPE
    assert got.prepared_transaction_offset == result.half.send.commit_log_offset
    assert "TRAN_MSG" not in got.properties


def test_a_rolled_back_transaction_is_never_consumed(broker: Broker) -> None:
    with TransactionProducer([addr(broker)], "pg", by_body({b"no": COMMIT})) as tp:
        result = tp.send_in_transaction("orders", b"no", lambda _h: ROLLBACK, queue_id=0)
        assert result.state is ROLLBACK and result.end_error is None
        # the checker would say COMMIT, but nothing is left to check
        threading.Event().wait(1.0)
        assert tp.checks == 0
    assert read_all(broker, "orders") == []


def test_a_transaction_whose_producer_died_is_checked_with_another_of_its_group(
        broker: Broker) -> None:
    """The first producer sends the halves and is gone before their ends; the broker asks
    the group's live producer, whose checker commits one and rolls back the other."""
    with TransactionProducer([addr(broker)], "pg", by_body({})) as first:
        kept = first.send_half("orders", b"keep", queue_id=0)
        first.send_half("orders", b"drop", queue_id=0)
    checker = by_body({b"keep": COMMIT, b"drop": ROLLBACK})
    with TransactionProducer([addr(broker)], "pg", checker, heartbeat_ms=200) as second:
        got = wait_for(lambda: read_all(broker, "orders"), "the checked commit", timeout_s=20)
        wait_for(lambda: b"drop" in checker.calls, "the check of the other")
        assert [m.body for m in got] == [b"keep"]
        assert got[0].properties[HALF_ORIGIN] == str(kept.send.commit_log_offset)
        # decided: the other end is refused, the same one answered again
        with pytest.raises(BrokerError) as refused:
            second.end(kept, ROLLBACK)
        assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
        assert "final" in refused.value.remark
        second.end(kept, COMMIT)
    assert [m.body for m in read_all(broker, "orders")] == [b"keep"]
    check = broker.status()["transactions"]["check"]
    assert check["answered_commit"] == 1 and check["answered_rollback"] == 1


def test_a_transaction_never_decided_goes_to_the_check_max_topic_where_an_operator_ends_it(
        broker: Broker, capsys: pytest.CaptureFixture[str]) -> None:
    checker = by_body({})
    with TransactionProducer([addr(broker)], "pg", checker, heartbeat_ms=200) as tp:
        result = tp.send_in_transaction("orders", b"maybe", lambda _h: UNKNOWN, queue_id=0)
        assert result.state is UNKNOWN
        kept = wait_for(lambda: stored(broker, CHECK_MAX_TOPIC), "the give-up", timeout_s=30)
    assert [m.body for m in kept] == [b"maybe"]
    assert len(checker.calls) == 3  # transactionCheckMax
    assert read_all(broker, "orders") == []
    # an operator lists it (clients cannot read the system topic) and commits it, once
    server = addr(broker)
    assert main(["transactions", "-s", server, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    [row] = listed["givenUp"]
    assert listed["nextOffset"] == listed["maxOffset"] == 1
    assert row["offset"] == kept[0].commit_log_offset and row["topic"] == "orders"
    assert row["group"] == "pg" and row["origin"] == result.half.send.commit_log_offset
    assert row["transactionId"] == result.half.transaction_id and row["checks"] == 3
    assert main(["transactions", "-s", server, "--end", str(row["offset"]), "--commit",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["repeated"] is False
    assert [m.body for m in read_all(broker, "orders")] == [b"maybe"]
    assert main(["transactions", "-s", server, "--end", str(row["offset"]), "--rollback"]) == 1
    assert "final" in capsys.readouterr().err
    assert main(["transactions", "-s", server, "--end", str(row["offset"]), "--commit"]) == 0
    assert "decided already" in capsys.readouterr().out
    assert [m.body for m in read_all(broker, "orders")] == [b"maybe"]
    with pytest.raises(SystemExit) as usage:
        main(["transactions", "-s", server, "--commit"])
    assert usage.value.code == 2


def test_what_a_producer_may_not_send(broker: Broker) -> None:
    with Producer([addr(broker)]) as p:
        for props in ({HALF_ORIGIN: "0"}, {"__TRAN_STATE": "COMMIT"}):
            with pytest.raises(BrokerError, match="set by the broker"):
                p.send("orders", b"x", properties=props, queue_id=0)
        with pytest.raises(BrokerError, match="PGROUP"):
            p.send("orders", b"x", properties={"TRAN_MSG": "true"}, queue_id=0)
        plain = p.send("orders", b"plain", queue_id=0)
    with TransactionProducer([addr(broker)], "pg", by_body({})) as tp:
        half = tp.send_half("orders", b"h", queue_id=0)
        not_half = half._replace(send=plain)
        with pytest.raises(BrokerError, match="no half message"):
            tp.end(not_half, COMMIT)
    with TransactionProducer([addr(broker)], "other", by_body({})) as intruder, \
            pytest.raises(BrokerError, match="producer group pg"):
        intruder.end(half, COMMIT)
    assert [m.body for m in read_all(broker, "orders")] == [b"plain"]


def test_an_end_must_name_the_transaction_id_the_broker_gave(broker: Broker) -> None:
    """An END whose transactionId was empty was checked on its offsets, group and topic
    alone, all of which can be guessed; the half's unique key is the client's (and its
    consumers') id, not a secret. Only the broker's random id, in its answer to the half,
    ends the transaction."""
    with TransactionProducer([addr(broker)], "pg", by_body({})) as tp:
        half = tp.send_half("orders", b"h", queue_id=0)
        for guess in ("", half.send.msg_id, getattr(half, "message_id", "")):
            with pytest.raises(BrokerError, match="transactionId") as refused:
                tp.end(half._replace(transaction_id=guess), ROLLBACK)
            assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
        assert len(half.transaction_id) == 32 and half.transaction_id != half.message_id
        tp.end(half, COMMIT)
    [got] = wait_for(lambda: read_all(broker, "orders"), "the commit", timeout_s=20)
    assert got.body == b"h"


def test_a_commit_the_slave_did_not_take_is_not_rolled_back(tmp_path: Path) -> None:
    """rmq#3885: a SYNC_MASTER whose slave is away stores the commit (its op waits for the
    next batch) but cannot promise it (SLAVE_NOT_AVAILABLE); the transaction stays committed:
    the same end again is answered without a write, a rollback is refused, no check asks
    about it."""
    cfg = load_config(None, (), env={}, listenPort=free_port(), haListenPort=free_port(),
                      storePathRootDir=str(tmp_path / "b"), mappedFileSizeCommitLog=1024 * 1024,
                      brokerRole="SYNC_MASTER", transactionCheckInterval=200,
                      transactionTimeOut=300, brokerName="tb")
    b = Broker(cfg, MessageStore(cfg), make_role)
    b.start()
    try:
        checker = by_body({b"x": ROLLBACK})
        with TransactionProducer([addr(b)], "pg", checker, retries=0, heartbeat_ms=200) as tp:
            half = tp.send_half("orders", b"x", queue_id=0)
            assert half.send.status.name == "SLAVE_NOT_AVAILABLE"  # stored, not promised
            with pytest.raises(BrokerError) as first:
                tp.end(half, COMMIT)
            assert first.value.code == ResponseCode.SLAVE_NOT_AVAILABLE
            tp.end(half, COMMIT)  # repeated: nothing more to write
            with pytest.raises(BrokerError, match="final"):
                tp.end(half, ROLLBACK)
            threading.Event().wait(1.0)  # several check rounds
            assert checker.calls == []
        assert [m.body for m in read_all(b, "orders")] == [b"x"]
        assert b.store.transactions.status()["repeated"] == 1
    finally:
        b.shutdown()


def test_replog_send_transaction(broker: Broker, capsys: pytest.CaptureFixture[str]) -> None:
    server = addr(broker)
    for state, body in (("commit", "yes"), ("rollback", "no")):
        assert main(["send", "-s", server, "-t", "orders", "-b", body, "--queue", "0",
                     "--transaction", state, "--json"]) == 0
        sent = json.loads(capsys.readouterr().out)
        assert sent["state"] == state.upper() and sent["endError"] is None
        assert sent["transactionId"]
    with pytest.raises(SystemExit) as usage:  # a usage error
        main(["send", "-s", server, "-t", "orders", "-b", "x", "--transaction", "commit",
              "--delay", "5s"])
    assert usage.value.code == 2
    assert [m.body for m in read_all(broker, "orders")] == [b"yes"]
