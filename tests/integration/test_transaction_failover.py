"""The transaction drill (issue 39): a controller-mode group of three SYNC_MASTER members, two
producer processes running transactions the whole time (each decided COMMIT or ROLLBACK by
its sequence number, a sixth left UNKNOWN for the check-back, which the producers answer the
same way), and, round after round, a producer SIGKILLed (often between a half and its end)
and the master SIGKILLed: as an END arrives (half stored, no end), between a commit and its
op (``tx_crash/sitecustomize.py``), or at a random moment. Each killed one restarts (a
master rejoins as a slave).

Then every acknowledged half must be decided as its producer's application decides it: a
transaction to commit consumed exactly once, one to roll back never consumed; nothing
consumed that was rolled back, whether its half was acknowledged or not.
"""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from broker_harness import REPO
from controller_harness import (
    Group,
    chroot,
    read_queue,
    running_zookeeper,
    wait_sync_state_set,
)
from tx_producer import TOPIC, final

from common.client import TransactionProducer, TransactionState
from common.core.message import PROPERTY_UNIQ_KEY
from common.core.transaction import HALF_ORIGIN
from common.store.transaction.service import TransactionStore

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
ROUNDS = 6  # master kills: at an END, after a commit, at random, twice each
BODY = struct.Struct(">q")


def start_producer(addresses: list[str], first: int, logs: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(HERE / "tx_producer.py"), ",".join(addresses), "drill-group",
         str(first), str(logs / f"p{first}.jsonl")],
        env=env, stdout=subprocess.DEVNULL, stderr=(logs / f"p{first}.err").open("w"))


def read_all(addresses: list[str]) -> list[int]:
    return [BODY.unpack_from(m.body)[0] for m in read_queue(addresses, TOPIC)]


def copies(addresses: list[str], seqs: list[int]) -> list[dict[str, object]]:
    """What tells the copies of a message consumed twice apart: their half (origin), their
    transaction id (the half's uniq key: equal when the client sent the half twice), where."""
    return [{"seq": BODY.unpack_from(m.body)[0], "origin": m.properties.get(HALF_ORIGIN),
             "uniq": m.properties.get(PROPERTY_UNIQ_KEY), "phy": m.commit_log_offset,
             "half_phy": m.prepared_transaction_offset}
            for m in read_queue(addresses, TOPIC) if BODY.unpack_from(m.body)[0] in seqs]


def logged(logs: Path) -> tuple[set[int], set[int]]:
    """(halves acknowledged, halves whose send failed or was not promised)."""
    acked, unsure = set(), set()
    for path in logs.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # the line a kill cut
            if "half" in entry:
                acked.add(entry["half"])
            elif "unsure" in entry:
                unsure.add(entry["unsure"])
    return acked, unsure


@pytest.mark.timeout(420)
def test_transactions_survive_producer_and_master_kills(tmp_path: Path) -> None:
    # what tx_crash/sitecustomize.py patches
    assert callable(getattr(TransactionStore, "end", None)), "update tx_crash/sitecustomize.py"
    rng = random.Random(39)
    flags, logs = tmp_path / "flags", tmp_path / "logs"
    flags.mkdir()
    logs.mkdir()
    env = {"PYTHONPATH": f"{HERE / 'tx_crash'}{os.pathsep}{REPO}",
           "TEST_TX_CRASH_DIR": str(flags)}
    producers: list[subprocess.Popen[bytes]] = []
    failovers, kinds = [], []
    with running_zookeeper(tmp_path / "zk") as zk, \
            Group(tmp_path, zk.hosts + chroot(), extra_env=env, transactionCheckInterval=500,
                  transactionTimeOut=1000) as g:
        wait_sync_state_set(g.master().status, {1, 2, 3})
        generation = 0
        for k in range(2):
            producers.append(start_producer(g.addresses, (k + 1) * 10_000_000, logs))
        try:
            for i in range(ROUNDS):
                time.sleep(rng.uniform(1.5, 3.0))
                k = i % 2  # a producer dies, perhaps between a half and its end
                os.kill(producers[k].pid, signal.SIGKILL)
                producers[k].wait(10)
                generation += 1
                producers[k] = start_producer(
                    g.addresses, (k + 1) * 10_000_000 + generation * 100_000, logs)
                master = g.master()
                kind = ("at-end", "after-commit", "random")[i % 3]
                killed_at = time.monotonic()
                if kind == "random":
                    os.kill(master.pid, signal.SIGKILL)
                else:
                    (flags / kind).touch()  # the master dies as it takes the next end
                master.proc.wait(30)  # type: ignore[union-attr]
                assert not (flags / kind).exists()
                kinds.append(kind)
                new = g.master(timeout_s=30)
                failovers.append(round(time.monotonic() - killed_at, 2))
                assert new is not master
                master.start()  # rejoins as a slave of the new master
            time.sleep(2.0)
            # the application stays up to answer the check-back, its producers stop sending
            checker = TransactionProducer(
                g.addresses, "drill-group",
                lambda half: TransactionState(final(BODY.unpack_from(half.body)[0])),
                heartbeat_ms=300)
        finally:
            for p in producers:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                p.wait(10)
        acked, unsure = logged(logs)
        to_commit = {s for s in acked if final(s) == "COMMIT"}
        consumed: list[int] = []
        deadline = time.monotonic() + 90  # checks every 0.5 s of halves older than 1 s
        while time.monotonic() < deadline:
            consumed = read_all(g.addresses)
            if to_commit <= set(consumed):
                break
            time.sleep(0.5)
        time.sleep(2.0)  # anything decided twice would show by now
        consumed = read_all(g.addresses)
        status = g.master().status()
        duplicated = sorted({s for s in consumed if consumed.count(s) > 1})
        twice = copies(g.addresses, duplicated[:5]) if duplicated else []
        checker.close()
    seen = set(consumed)
    rolled_back_consumed = sorted(s for s in seen if final(s) == "ROLLBACK")
    committed_lost = sorted(to_commit - seen)
    summary = {"drill": "transaction-failover", "master_kills": kinds, "failover_s": failovers,
               "acked_halves": len(acked), "unsure_halves": len(unsure),
               "to_commit": len(to_commit), "consumed": len(consumed),
               "rolled_back_consumed": len(rolled_back_consumed),
               "committed_lost": len(committed_lost), "duplicated": len(duplicated),
               "last_master": status["transactions"]}
    print(json.dumps(summary))
    assert len(acked) > 100, summary
    assert not rolled_back_consumed, f"{summary}; rolled back, consumed: {rolled_back_consumed[:10]}"
    assert not committed_lost, f"{summary}; to commit, never consumed: {committed_lost[:10]}"
    assert not duplicated, f"{summary}; consumed twice: {duplicated[:10]}, copies {twice}"
