"""The POP drill (issue 40): a controller-mode group of three SYNC_MASTER members, a producer
sending to a plain topic and a FIFO one (eight message groups), and 8 POP consumer processes of
one group (``pop_consumer.py``: four per topic, each acking nine messages of ten, letting the
tenth time out); two consumers SIGKILLed at random moments, the master SIGKILLed twice (it
rejoins as a slave).

Then: no acknowledged message lost (every one acked by some consumer in the end: an ack the
broker confirmed, or, for an ack whose consumer was killed before it heard back, the broker's
answer to that receipt handle sent again: acked before, or acked now); no message
handed out again after an ack the broker confirmed; no hand-out counted twice alike (a
``reconsume_times`` seen twice for one message would be a count reset by a failover); in the
FIFO topic, no message handed out before the one before it in its group was acked.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from broker_harness import REPO
from controller_harness import Group, chroot, running_zookeeper, wait_sync_state_set

from common.client import Producer, SimpleConsumer
from common.core.errors import BrokerError, SendStatus

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
PLAIN, FIFO, GROUP = "popd", "popf", "popg"
KEYS = [f"K{i}" for i in range(8)]


def start_consumer(addresses: list[str], topic: str, fifo: bool, n: int,
                   logs: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(HERE / "pop_consumer.py"), ",".join(addresses), GROUP, topic,
         "1" if fifo else "0", str(n), str(logs / f"c{n}.jsonl"), str(logs / "stop")],
        env=env, stdout=subprocess.DEVNULL, stderr=(logs / f"c{n}.err").open("w"))


class Sender(threading.Thread):
    """Sends to both topics, one message at a time, and keeps what was acknowledged."""

    def __init__(self, addresses: list[str]):
        super().__init__(daemon=True)
        self.addresses = addresses
        self.stop = threading.Event()
        self.acked: dict[int, tuple[str, str | None]] = {}  # seq -> (topic, key)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Producer(self.addresses, timeout_ms=5000, retries=3) as p:
                seq = 0
                while not self.stop.is_set():
                    seq += 1
                    fifo = seq % 2 == 0
                    topic, key = (FIFO, KEYS[seq % len(KEYS)]) if fifo else (PLAIN, None)
                    body = b"%d|" % seq + b"x" * 64
                    try:
                        r = p.send(topic, body, shard_key=key)
                    except BrokerError:
                        continue
                    if r.status == SendStatus.SEND_OK:
                        self.acked[seq] = (topic, key)
                    self.stop.wait(0.01)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def settled(entries: list[dict[str, Any]], checker: SimpleConsumer, known: set[int]) -> set[int]:
    """The messages acked: an ack the broker confirmed to its consumer, or one a consumer sent
    and did not hear back about (it was killed meanwhile) whose receipt handle, sent again, the
    broker takes (it had acked it, or it still held the message out under that handle: either
    way it never lost it). A handle it refuses (the message was handed out again since) leaves
    the message to the consumer it went to next."""
    done = known | {e["acked"] for e in entries if "acked" in e}
    for e in entries:
        if "acking" in e and e["acking"] not in done:
            try:
                checker.ack(e["handle"])
            except BrokerError:
                continue
            done.add(e["acking"])
    return done


def read_logs(logs: Path) -> list[dict[str, Any]]:
    entries = []
    for path in logs.glob("c*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                entries.append({**json.loads(line), "c": path.stem})
            except ValueError:
                continue  # the line a kill cut
    return entries


@pytest.mark.timeout(420)
def test_pop_consumers_and_the_master_killed_lose_nothing_and_keep_order(tmp_path: Path) -> None:
    rng = random.Random(40)
    logs = tmp_path / "logs"
    logs.mkdir()
    consumers: list[subprocess.Popen[bytes]] = []
    failovers = []
    with running_zookeeper(tmp_path / "zk") as zk, \
            Group(tmp_path, zk.hosts + chroot()) as g:
        wait_sync_state_set(g.master().status, {1, 2, 3})
        sender = Sender(g.addresses)
        sender.start()
        try:
            while len(sender.acked) < 20:  # both topics exist before the consumers ask
                time.sleep(0.1)
            consumers = [start_consumer(g.addresses, FIFO if n % 2 else PLAIN, n % 2 == 1, n,
                                        logs) for n in range(8)]
            victims = rng.sample(range(8), 2)
            for round_ in range(2):
                time.sleep(rng.uniform(2.0, 4.0))
                os.kill(consumers[victims[round_]].pid, signal.SIGKILL)  # holding messages
                time.sleep(rng.uniform(1.0, 3.0))
                failovers.append(g.kill_master())
            time.sleep(3.0)
            sender.stop.set()
            sender.join(30)
            assert sender.error is None, sender.error
            want = dict(sender.acked)
            deadline = time.monotonic() + 120
            acked: set[int] = set()
            with SimpleConsumer(g.addresses, GROUP, timeout_ms=5000) as checker:
                while time.monotonic() < deadline:
                    acked = settled(read_logs(logs), checker, acked)
                    if set(want) <= acked:
                        break
                    time.sleep(1.0)
        finally:
            (logs / "stop").touch()
            sender.stop.set()
            for c in consumers:
                try:
                    c.wait(15)
                except subprocess.TimeoutExpired:
                    os.kill(c.pid, signal.SIGKILL)
                    c.wait(10)
        status = g.master().status()
    entries = read_logs(logs)
    lost = sorted(set(want) - acked)
    confirmed = {e["acked"] for e in entries if "acked" in e}
    # a stored message is (topic, queue, queue offset): a send retried across a failover may store
    # one body twice, each copy handed out and acked on its own
    first_ack: dict[Any, float] = {}  # the first ack confirmed to its consumer
    first_asked: dict[int, float] = {}  # by body: when a consumer first sent an ack of it
    for e in entries:
        if "acked" in e:
            where = (e["topic"], e["q"], e["o"])
            first_ack[where] = min(first_ack.get(where, e["t"]), e["t"])
        if "acking" in e:  # sent, heard back or not
            first_asked[e["acking"]] = min(first_asked.get(e["acking"], e["asked"]), e["asked"])
    got = [e for e in entries if "got" in e]
    after_ack = [e for e in got if (e["topic"], e["q"], e["o"]) in first_ack
                 and e["t"] > first_ack[(e["topic"], e["q"], e["o"])]]
    counts: dict[Any, list[int]] = defaultdict(list)
    for e in got:
        counts[(e["topic"], e["q"], e["o"])].append(e["times"])
    counted_twice = sorted(s for s, times in counts.items() if len(times) != len(set(times)))
    # FIFO: each message handed out only after the one before it in its group was acked (the
    # broker takes an ack between its consumer sending it and hearing back: the next one may
    # go out before the first consumer heard, never before it asked)
    by_key: dict[str, list[int]] = defaultdict(list)
    for seq, (topic, key) in sorted(want.items()):
        if topic == FIFO and key is not None:
            by_key[key].append(seq)
    first_got: dict[int, float] = {}
    for e in got:
        first_got[e["got"]] = min(first_got.get(e["got"], e["t"]), e["t"])
    out_of_order = []
    for seqs in by_key.values():
        for before, after in itertools.pairwise(seqs):
            if after in first_got and (before not in first_asked
                                       or first_got[after] < first_asked[before]):
                out_of_order.append((before, after))
    summary = {"drill": "pop-failover", "failover_s": failovers, "sent": len(want),
               "deliveries": len(got), "redelivered": sum(1 for e in got if e["times"] > 0),
               "lost": len(lost), "after_ack": len(after_ack),
               "acks_settled_by_checker": len((acked - confirmed) & set(want)),
               "counted_twice": len(counted_twice), "out_of_order": len(out_of_order),
               "pop": status.get("pop")}
    print(json.dumps(summary))
    assert len(want) > 300, summary
    assert not lost, f"{summary}; acknowledged, never acked by a consumer: {lost[:10]}"
    assert not after_ack, f"{summary}; handed out after an ack: {after_ack[:5]}"
    assert not counted_twice, f"{summary}; a count seen twice: {counted_twice[:10]}"
    assert not out_of_order, f"{summary}; FIFO broken: {out_of_order[:10]}"
