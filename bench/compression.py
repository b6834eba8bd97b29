"""Compressed bodies: what deflating costs the producer and what it saves the log.

Bodies are log-like text (compressible, as JSON or log lines are) of 4, 16 and 64 KiB. For
each size, in one run:

* the codec alone, in this process: ``compress_body`` at level 5 and ``inflate_body``, MB/s
  of body as sent (the producer pays the first per send, the consumer the second per read);
* ``Producer.send`` (1 in flight) and ``send_batch`` of 16 to one ASYNC_MASTER broker over
  tcp://127.0.0.1, with compression on (RocketMQ's default: bodies >= 4 KiB) and off
  (``compress_over_bytes=None``): msgs/s, MB/s of body as sent, p50/p99, and the CommitLog
  bytes each message took (``maxPhyOffset`` growth / messages).

    .venv/bin/python bench/compression.py [--count 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import _support
from _support import Figure

from common.client import Admin, Producer
from common.core.message import compress_body, inflate_body

SIZES = (4096, 16 * 1024, 64 * 1024)
BATCH = 16


def text_body(size: int) -> bytes:
    """Log-like lines with changing numbers: deflates about 4-6x, as real text does."""
    out = bytearray()
    i = 0
    while len(out) < size:
        out += b'{"ts":%d,"order":"o-%07d","sku":%d,"qty":%d,"state":"shipped"}\n' % (
            1_700_000_000_000 + i * 37, i * 7919 % 10_000_000, i * 31 % 4999, i % 9 + 1)
        i += 1
    return bytes(out[:size])


def codec(body: bytes, rounds: int) -> tuple[float, float, float]:
    """(deflate MB/s, inflate MB/s, ratio) over ``rounds`` of ``body``."""
    packed = compress_body(body, 5)
    assert packed is not None
    t = time.perf_counter()
    for _ in range(rounds):
        compress_body(body, 5)
    deflate_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(rounds):
        inflate_body(packed)
    inflate_s = time.perf_counter() - t
    mb = len(body) * rounds / 1e6
    return mb / deflate_s, mb / inflate_s, len(body) / len(packed)


def sends(address: str, body: bytes, count: int, compress: bool) -> tuple[Figure, Figure, float]:
    """(sync figure, batch figure, CommitLog bytes per message) for one setting."""
    over = 4096 if compress else None
    admin = Admin([address])
    with Producer([address], compress_over_bytes=over) as p:
        p.send("cb", body, queue_id=0)  # warm: route, connection, segment
        before = admin.status()["maxPhyOffset"]
        lat = []
        start = time.perf_counter()
        for _ in range(count):
            t = time.perf_counter()
            p.send("cb", body, queue_id=0)
            lat.append((time.perf_counter() - t) * 1000)
        sync = Figure("sync" + (" deflated" if compress else " plain"), count,
                      time.perf_counter() - start, lat, len(body))
        per_msg = (admin.status()["maxPhyOffset"] - before) / count
        batches = max(1, count // BATCH)
        lat = []
        start = time.perf_counter()
        for _ in range(batches):
            t = time.perf_counter()
            p.send_batch("cb", [body] * BATCH, queue_id=0)
            lat.append((time.perf_counter() - t) * 1000)
        batch = Figure(f"batch{BATCH}" + (" deflated" if compress else " plain"),
                       batches * BATCH, time.perf_counter() - start, lat, len(body))
    admin.close()
    return sync, batch, per_msg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=2000, help="sends per figure (64 KiB: /4)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        proc, address = _support.start_broker(
            Path(home), brokerRole="ASYNC_MASTER", flushDiskType="ASYNC_FLUSH",
            mappedFileSizeCommitLog=512 * 1024 * 1024)
        try:
            for size in SIZES:
                body = text_body(size)
                count = args.count if size < 64 * 1024 else args.count // 4
                deflate, inflate, ratio = codec(body, max(50, count // 4))
                print(f"{size // 1024} KiB text bodies: deflate {deflate:.0f} MB/s, inflate "
                      f"{inflate:.0f} MB/s (level 5, ratio {ratio:.1f}x)")
                plain_sync, plain_batch, plain_bytes = sends(address, body, count, False)
                on_sync, on_batch, on_bytes = sends(address, body, count, True)
                print(plain_sync.line())
                print(on_sync.line(plain_sync))
                print(plain_batch.line())
                print(on_batch.line(plain_batch))
                print(f"  CommitLog bytes per message: {plain_bytes:.0f} plain, {on_bytes:.0f} "
                      f"deflated ({plain_bytes / on_bytes:.1f}x less)")
        finally:
            _support.stop(proc)


if __name__ == "__main__":
    main()
