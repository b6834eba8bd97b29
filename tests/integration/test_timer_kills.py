"""Timer messages through kills (issue 38's property): for a random schedule of timer sends,
SIGKILLs and restarts of a broker process, every acknowledged timer message is delivered once,
never before its time.

Each schedule (a seed) runs a producer thread that sends timer messages due 0.2 to 4 s later,
each body naming its sequence number and due time, while the main thread SIGKILLs the broker
at random moments (in the middle of enqueues, deliveries and checkpoints: the checkpoint runs
every 200 ms here) and starts it again. At the end every due time has passed; the real topic
is read whole. Checked: each acknowledged message is there exactly once; no message (sent with
an acknowledgement or not) is there twice; none was delivered, or stored in its topic, before
its time. ``REPLOG_TIMER_SEEDS`` runs more schedules.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import threading
import time
from pathlib import Path

import pytest
from broker_harness import BrokerProcess

from common.client import Consumer, Producer
from common.core.errors import BrokerError, SendStatus
from common.core.timer import TIMER_DEQUEUE_MS

pytestmark = pytest.mark.integration

SEEDS = [int(s) for s in os.environ.get("REPLOG_TIMER_SEEDS", "381,382").split(",")]
BODY = struct.Struct(">qq")  # sequence number, due time (epoch ms)
TOPIC = "timed"
RUN_S = 12.0  # sends and kills go on this long
LATEST_DUE_MS = 4000


def _sender(address: str, stop: threading.Event, rng: random.Random,
            acked: dict[int, int], tried: dict[int, int]) -> None:
    seq = 0
    with Producer([address], timeout_ms=3000, retries=0) as p:
        while not stop.is_set():
            seq += 1
            due = int(time.time() * 1000) + rng.randrange(200, LATEST_DUE_MS)
            tried[seq] = due
            try:
                r = p.send(TOPIC, BODY.pack(seq, due) + b"-" * 32, queue_id=0, deliver_at=due)
            except BrokerError:
                time.sleep(0.05)  # the broker is down: unknown whether it was stored
                continue
            if r.status == SendStatus.SEND_OK:
                acked[seq] = due
            time.sleep(rng.uniform(0.0, 0.01))


def _read_all(address: str) -> list[tuple[int, int, int, int]]:
    """(seq, due, TIMER_DEQUEUE_MS, store timestamp) of every delivered message."""
    out = []
    offset = 0
    with Consumer([address], group="check") as c:
        while True:
            got = c.pull(TOPIC, 0, offset, 256)
            if not got.messages:
                return out
            for m in got.messages:
                seq, due = BODY.unpack_from(m.body)
                # a send that reached the broker after its time is stored at once, a plain message
                dequeued = int(m.properties.get(TIMER_DEQUEUE_MS, m.store_timestamp))
                out.append((seq, due, dequeued, m.store_timestamp))
            offset = got.next_begin_offset


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", SEEDS)
def test_any_schedule_of_sends_and_kills_delivers_each_acked_timer_message_once_never_early(
        tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    broker = BrokerProcess(tmp_path / "b", timerPrecisionMs=100, timerFlushIntervalMs=200,
                           mappedFileSizeTimerLog=52 * 2000, flushIntervalCommitLog=50)
    acked: dict[int, int] = {}
    tried: dict[int, int] = {}
    stop = threading.Event()
    kills = 0
    try:
        broker.start()
        sender = threading.Thread(target=_sender, daemon=True,
                                  args=(broker.address, stop, random.Random(seed + 1), acked,
                                        tried))
        sender.start()
        ends = time.monotonic() + RUN_S
        while time.monotonic() < ends:
            time.sleep(rng.uniform(0.3, 2.0))
            assert broker.proc is not None
            os.kill(broker.proc.pid, signal.SIGKILL)
            broker.proc.wait(10)
            kills += 1
            time.sleep(rng.uniform(0.0, 0.5))  # sends fail meanwhile; some come due
            broker.start()
        stop.set()
        sender.join(30)
        assert not sender.is_alive()
        settled = max(tried.values()) / 1000 + 2  # every due time passed, and then some
        delivered: list[tuple[int, int, int, int]] = []
        while time.time() < settled + 30:
            delivered = _read_all(broker.address)
            if time.time() > settled and {s for s, *_ in delivered} >= set(acked):
                break
            time.sleep(0.5)
    finally:
        stop.set()
        broker.close()
    seqs = [s for s, *_ in delivered]
    missing = sorted(set(acked) - set(seqs))
    twice = sorted(s for s in set(seqs) if seqs.count(s) > 1)
    early = [(s, due, deq, stored) for s, due, deq, stored in delivered
             if deq < due or stored < due]
    summary = (f"seed {seed}: {kills} kills, {len(tried)} sent, {len(acked)} acked, "
               f"{len(delivered)} delivered")
    print(summary)
    assert kills >= 3, summary
    assert len(acked) > 100, summary
    assert not missing, f"{summary}; acked but never delivered: {missing[:10]}"
    assert not twice, f"{summary}; delivered twice: {twice[:10]}"
    assert not early, f"{summary}; delivered early: {early[:5]}"
