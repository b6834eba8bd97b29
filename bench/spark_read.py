"""Rows/s of the replog batch source on Spark beside a plain single-process Python decode.

    .venv/bin/python bench/spark_read.py [--records 1000000] [--body 128] [--text] [--dir DIR] [--master local[2]]

Writes a store of ``--records`` messages with ``--body``-byte bodies in 64 MiB segments
(vectorised; RocketMQ layout through ``common.format.record``), then times, in this one run:

- ``plain``: one Python process decoding every record with the store's own record-by-record
  decoder (``commit_log.to_message``: header unpack, properties, msgId, hosts);
- ``vectorised``: the pipeline's numpy/Arrow decoder in one process, no Spark;
- ``spark``: ``spark.read.format("replog").load(dir)`` materialising every column
  (``write.format("noop")``), best of ``--runs`` after one warm-up query.

Spark session start-up is reported on its own. Target: spark >= 1.5x plain.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.core.message import encode_properties, host_bytes
from common.format import record
from common.pipeline.decode import Records, decode, walk
from common.pipeline.layout import list_segments
from common.store.commit_log import to_message

SEGMENT_BYTES = 64 * 1024 * 1024
TOPIC = b"bench"
QUEUES = 8


def write_store(root: Path, count: int, body_bytes: int, seed: int = 1, text: bool = False) -> int:
    """``count`` records of one size laid out in full segments with BLANK tails; returns bytes.
    Bodies are random bytes (not UTF-8: ``body`` is null, the slow path) or printable ASCII."""
    rng = np.random.default_rng(seed)
    props = encode_properties({"TAGS": "TagA", "KEYS": "key-000000"})
    key_at = props.index(b"000000")
    template = np.frombuffer(bytes(record.encode(
        TOPIC, bytes(body_bytes), props, 0, born_timestamp=1_700_000_000_000,
        born_ip=host_bytes("10.0.0.7"), born_port=5555, store_ip=host_bytes("127.0.0.1"),
        store_port=10911)), dtype=np.uint8)
    size = template.size
    per_segment = (SEGMENT_BYTES - record.END_FILE_MIN_BLANK) // size
    (root / "commitlog").mkdir(parents=True, exist_ok=True)
    written = 0
    for seg_index, first in enumerate(range(0, count, per_segment)):
        n = min(per_segment, count - first)
        recs = np.tile(template, (n, 1))
        idx = np.arange(first, first + n, dtype=np.int64)
        base = seg_index * SEGMENT_BYTES
        low, high = (32, 127) if text else (0, 256)
        bodies = rng.integers(low, high, size=(n, body_bytes), dtype=np.uint8)
        recs[:, record.HEADER.size : record.HEADER.size + body_bytes] = bodies
        crcs = np.fromiter((zlib.crc32(b) & 0x7FFFFFFF for b in bodies), dtype=">i4", count=n)
        _put(recs, 8, crcs.astype(">i4"))
        _put(recs, 12, (idx % QUEUES).astype(">i4"))
        _put(recs, 20, (idx // QUEUES).astype(">i8"))
        _put(recs, 28, (base + np.arange(n, dtype=np.int64) * size).astype(">i8"))
        _put(recs, 40, (1_700_000_000_000 + idx).astype(">i8"))
        _put(recs, 56, (1_700_000_000_000 + idx + idx % 7).astype(">i8"))
        digits = np.char.zfill((idx % 1_000_000).astype(str), 6).astype("S6")
        props_at = record.HEADER.size + body_bytes + 1 + len(TOPIC) + 2
        recs[:, props_at + key_at : props_at + key_at + 6] = digits.view(np.uint8).reshape(n, 6)
        with open(root / "commitlog" / f"{base:020d}", "wb") as f:
            f.truncate(SEGMENT_BYTES)
            f.write(recs.tobytes())
            if n == per_segment:
                f.write(record.blank(SEGMENT_BYTES - n * size))
        written += n * size
    return written


def _put(recs: np.ndarray, at: int, values: np.ndarray) -> None:
    width = values.dtype.itemsize
    recs[:, at : at + width] = values.view(np.uint8).reshape(-1, width)


def plain_decode(root: Path) -> int:
    """Every record through the store's per-record decoder, in this process."""
    rows = 0
    for seg in list_segments(root):
        raw = Path(seg.path).read_bytes()
        pos = 0
        end = len(raw) - record.FIXED_BYTES
        while pos <= end:
            total, magic = record.HEAD_PREFIX.unpack_from(raw, pos)
            if magic != record.MAGIC_V1:
                break
            to_message(raw, pos)
            rows += 1
            pos += total
    return rows


def vectorised_decode(root: Path) -> int:
    rows = 0
    for seg in list_segments(root):
        buf = np.fromfile(seg.path, dtype=np.uint8)
        found = walk(buf, seg.base)
        for i in range(0, found.starts.size, 65536):
            rows += decode(Records(buf, found.starts[i : i + 65536])).num_rows
    return rows


def timed(fn, *args):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def main() -> int:
    # SIGTERM (a stopped make bench) unwinds like Ctrl-C: the temporary stores are removed
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--body", type=int, default=128)
    ap.add_argument("--text", action="store_true",
                    help="printable ASCII bodies (default: random bytes, which are not UTF-8)")
    ap.add_argument("--dir", help="store directory to (re)use; default a temp dir, removed after")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="replog-bench-"))
    try:
        if not (root / "commitlog").is_dir():
            nbytes, t_gen = timed(write_store, root, args.records, args.body, 1, args.text)
            print(f"wrote {args.records} records, {nbytes / 2**20:.0f} MiB in {t_gen:.1f} s",
                  file=sys.stderr)
        n_plain, t_plain = timed(plain_decode, root)
        n_vec, t_vec = timed(vectorised_decode, root)
        assert n_plain == n_vec == args.records, (n_plain, n_vec)

        from common.pipeline.session import build_session

        spark, t_session = timed(build_session, args.master, "replog-bench", "2g")
        try:
            df = spark.read.format("replog").load(str(root))
            partitions = df.rdd.getNumPartitions()
            assert df.count() == args.records
            _, t_warm = timed(lambda: df.write.format("noop").mode("overwrite").save())
            runs = [timed(lambda: df.write.format("noop").mode("overwrite").save())[1]
                    for _ in range(args.runs)]
        finally:
            spark.stop()
        t_spark = min(runs)
        figures = {
            "records": args.records,
            "bodyBytes": args.body,
            "bodies": "ASCII text" if args.text else "random bytes",
            "segments": len(list_segments(root)),
            "sparkPartitions": partitions,
            "master": args.master,
            "sessionStartS": round(t_session, 2),
            "plainRowsPerS": round(n_plain / t_plain),
            "vectorisedRowsPerS": round(n_vec / t_vec),
            "sparkRowsPerS": round(args.records / t_spark),
            "sparkFirstNoopS": round(t_warm, 2),
            "sparkRunsS": [round(t, 2) for t in runs],
            "sparkOverPlain": round(t_plain / t_spark, 2),
            "cpus": os.cpu_count(),
        }
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:20s} {value}")
        verdict = "meets" if figures["sparkOverPlain"] >= 1.5 else "misses"
        print(f"target spark >= 1.5x plain: {verdict} ({figures['sparkOverPlain']}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
