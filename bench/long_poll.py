"""Long-polling latency: how soon a parked pull is answered after a message is sent.

Starts one ASYNC_MASTER broker on a free port, parks a pull at the end of a queue
(``suspend_ms`` 5000), sends one message from another thread 20 ms later, and measures from
the start of that send to the pull's answer (so the send's own round trip is included).

    .venv/bin/python bench/long_poll.py [--rounds 50]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import _support

from common.client import Consumer, Producer
from common.core.errors import PullStatus


def _send_later(producer: Producer, sent_at: list[float]) -> None:
    time.sleep(0.02)
    sent_at.append(time.perf_counter())
    producer.send("lp", b"x", queue_id=0)


def measure(address: str, rounds: int) -> list[float]:
    latencies = []
    with Producer([address]) as p, Consumer([address]) as c:
        p.send("lp", b"warm", queue_id=0)
        offset = c.pull("lp", 0, 0, 32).next_begin_offset
        for _ in range(rounds):
            sent_at: list[float] = []
            sender = threading.Thread(target=_send_later, args=(p, sent_at))
            sender.start()
            got = c.pull("lp", 0, offset, 32, suspend_ms=5000)
            answered = time.perf_counter()
            sender.join()
            if got.status is not PullStatus.FOUND:
                raise RuntimeError(f"parked pull answered {got.status}")
            offset = got.next_begin_offset
            latencies.append((answered - sent_at[0]) * 1000)
    return sorted(latencies)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        proc, address = _support.start_broker(Path(home), brokerRole="ASYNC_MASTER")
        try:
            lat = measure(address, args.rounds)
        finally:
            _support.stop(proc)
    p90 = lat[int(0.9 * (len(lat) - 1))]
    print(f"long poll, {len(lat)} rounds: send -> parked pull answered: "
          f"p50 {statistics.median(lat):.2f} ms, p90 {p90:.2f} ms, max {lat[-1]:.2f} ms "
          "(includes the send's own round trip)")


if __name__ == "__main__":
    main()
