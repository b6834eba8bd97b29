"""The audit, stats and reindex jobs, each checked against a plain-Python expectation."""

from __future__ import annotations

import json
import struct
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from storegen import CQ_ENTRY
from stores import write_store

from common.pipeline import jobs
from common.pipeline.audit import BLOCK_BYTES
from common.pipeline.layout import list_segments

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory):
    """About 1.5 MiB of log (two audit blocks) in 256 KiB segments."""
    made = write_store(tmp_path_factory.mktemp("master") / "store", 6000, 256 * 1024, seed=11)
    return made.root, made.written


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = jobs.main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_audit_of_a_byte_copy_is_identical(spark, master, tmp_path, capsys) -> None:
    import shutil

    root, written = master
    shutil.copytree(root, tmp_path / "slave")
    code, report = run_main(capsys, "audit", str(root), str(tmp_path / "slave"),
                            "--require-identical")
    end = written[-1].phy_offset + written[-1].size
    assert code == 0
    assert report["identical"] and not report["divergent"]
    assert report["blocksCompared"] == 2 and end > BLOCK_BYTES
    assert report["replicatedPrefix"] == end == report["master"]["end"] == report["slave"]["end"]


def test_audit_finds_a_single_flipped_byte(spark, master, tmp_path, capsys) -> None:
    import shutil

    root, written = master
    shutil.copytree(root, tmp_path / "slave")
    victim = next(w for w in written if w.phy_offset > BLOCK_BYTES + 1000 and len(w.body) > 20)
    flipped = victim.phy_offset + 88 + 17  # inside the body
    seg = next(s for s in list_segments(tmp_path / "slave") if s.base <= flipped < s.end)
    with open(seg.path, "r+b") as f:
        f.seek(flipped - seg.base)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x01]))
    code, report = run_main(capsys, "audit", str(root), str(tmp_path / "slave"))
    assert code == 1
    assert report["divergent"] and report["blocksDiffering"] == 1
    assert report["firstDifferentOffset"] == flipped
    assert report["replicatedPrefix"] == victim.phy_offset
    [diff] = report["differingRecords"]
    assert diff["offset"] == victim.phy_offset and diff["kind"] == "bytes"
    assert "CRC" in diff["detail"]


def test_audit_finds_a_truncated_slave(spark, master, tmp_path, capsys) -> None:
    import shutil

    root, written = master
    slave = tmp_path / "slave"
    shutil.copytree(root, slave)
    cut = written[4000]  # the slave holds records [0, 4000) and half of record 4000
    segments = list_segments(slave)
    holder = next(s for s in segments if s.base <= cut.phy_offset < s.end)
    with open(holder.path, "r+b") as f:
        f.seek(cut.phy_offset - holder.base + 50)
        f.write(bytes(holder.end - cut.phy_offset - 50))
    for seg in segments:
        if seg.base > holder.base:
            Path(seg.path).unlink()
    code, report = run_main(capsys, "audit", str(root), str(slave))
    end = written[-1].phy_offset + written[-1].size
    assert code == 0  # a prefix, not a divergence
    assert not report["divergent"] and not report["identical"]
    assert report["slave"]["end"] == report["replicatedPrefix"] == cut.phy_offset
    assert report["slaveBehindBytes"] == end - cut.phy_offset
    assert jobs.main(["audit", str(root), str(slave), "--require-identical"]) == 1
    assert "PREFIX" in capsys.readouterr().out


def plain_stats(written, top: int = 5) -> list[dict]:
    """The stats of section ``stats.py`` computed in plain Python from what was written."""
    groups: dict[tuple[str, int], list] = defaultdict(list)
    for w in written:
        groups[(w.topic, w.store_ms // 60_000 * 60_000)].append(w)
    rows = []
    for (topic, minute), ws in sorted(groups.items()):
        keys = Counter(k for w in ws for k in (w.props.get("KEYS") or "").split(" ") if k)
        latencies = np.array([w.store_ms - w.born_ms for w in ws], dtype=float)
        rows.append({
            "topic": topic, "minute": minute, "messages": len(ws),
            "bytes": sum(w.size for w in ws),
            "latencyP50Ms": float(np.percentile(latencies, 50)),
            "latencyP99Ms": float(np.percentile(latencies, 99)),
            "topKeys": sorted(keys.items(), key=lambda kv: (-kv[1], kv[0]))[:top],
        })
    return rows


def test_stats_match_a_plain_python_computation(spark, store, tmp_path, capsys) -> None:
    from common.pipeline.stats import run_stats

    out = tmp_path / "stats.parquet"
    rows = run_stats(spark, store.path, str(out))
    got = [{
        **{k: r[k] for k in ("topic", "messages", "bytes")},
        "minute": int(r["minute"].timestamp() * 1000),
        "latencyP50Ms": pytest.approx(r["latencyP50Ms"]),
        "latencyP99Ms": pytest.approx(r["latencyP99Ms"]),
        "topKeys": [(k["key"], k["count"]) for k in r["topKeys"]],
    } for r in rows]
    expected = plain_stats(store.written)
    assert len(expected) >= 3 and got == expected
    assert spark.read.parquet(str(out)).count() == len(expected)
    assert jobs.main(["stats", store.path, "--topics", "orders"]) == 0
    table = capsys.readouterr().out
    assert "orders" in table and "clicks" not in table and "p99 ms" in table


def cq_files(root: Path) -> dict[str, bytes]:
    base = root / "consumequeue"
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def cq_entry_at(root: Path, topic: str, queue_id: int, queue_offset: int, file_bytes: int
                ) -> tuple[Path, int]:
    """The ConsumeQueue file holding an entry and the entry's position in it."""
    pos = queue_offset * CQ_ENTRY.size
    start = pos - pos % file_bytes
    return root / "consumequeue" / topic / str(queue_id) / f"{start:020d}", pos - start


def test_reindex_rebuilds_the_brokers_consume_queues(spark, store, tmp_path, capsys) -> None:
    out = tmp_path / "rebuilt"
    code, report = run_main(capsys, "reindex", store.path, "--write", str(out),
                            "--cq-file-bytes", str(store.cq_file_bytes))
    assert code == 0 and report["consistent"]
    assert report["byKind"] == {"match": len(store.written)} and report["queues"] == 12
    on_disk = cq_files(store.root)
    assert len(on_disk) > 12  # queues span several ConsumeQueue files
    assert cq_files(out) == on_disk


def test_reindex_reports_wrong_and_missing_entries(spark, store, tmp_path, capsys) -> None:
    copy = store.copy(tmp_path / "copy")
    orders1 = [w for w in store.written if (w.topic, w.queue_id) == ("orders", 1)]
    assert [w.queue_offset for w in orders1] == list(range(len(orders1)))
    path, pos = cq_entry_at(copy.root, "orders", 1, 5, store.cq_file_bytes)
    with open(path, "r+b") as f:
        f.seek(pos + 8)  # size of queue offset 5
        f.write(struct.pack(">i", orders1[5].size + 1))
    path, pos = cq_entry_at(copy.root, "orders", 1, len(orders1) - 1, store.cq_file_bytes)
    with open(path, "r+b") as f:
        f.seek(pos)  # the last entry was never dispatched
        f.write(bytes(CQ_ENTRY.size))
    code, report = run_main(capsys, "reindex", copy.path)
    assert code == 1 and not report["consistent"]
    assert report["byKind"] == {"match": len(store.written) - 2, "differs": 1,
                                "missing_in_consumequeue": 1}
    first, second = report["examples"]
    assert (first["queueOffset"], first["kind"], first["cqSize"]) == (5, "differs", orders1[5].size + 1)
    assert (second["queueOffset"], second["kind"]) == (len(orders1) - 1, "missing_in_consumequeue")
