"""A store that was a slave and becomes a master continues every queue's offsets."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from common.core.config import load_config
from common.core.errors import CorruptionError, GetStatus, PutStatus
from common.core.message import Message
from common.ha import promotion
from common.store.checkpoint import StoreCheckpoint
from common.store.message_store import MessageStore

pytestmark = pytest.mark.unit


def open_store(root: Path, repair_from_master: bool | None = None,
               **over: object) -> MessageStore:
    store = MessageStore(load_config(env={}, storePathRootDir=str(root),
                                     mappedFileSizeCommitLog=16 * 1024,
                                     mappedFileSizeConsumeQueue=20 * 64, maxHashSlotNum=97,
                                     maxIndexNum=400, **over),
                         repair_from_master=repair_from_master)
    store.start()
    return store


@pytest.mark.timeout(60)
def test_promoted_replica_continues_queue_offsets(tmp_path: Path) -> None:
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s", brokerRole="SLAVE", brokerId=1)
    try:
        for i in range(100):
            assert master.put(Message("orders", b"m%d" % i, keys=f"k{i}"), i % 3).ok
        # the expected offsets are read from the master's ConsumeQueues: reput must be done
        assert master.wait_dispatched(master.max_phy_offset)
        offset = 0
        while offset < master.max_phy_offset:  # what the HA client does
            chunk = master.read_committed(offset, 1000)
            slave.append_replicated(offset, chunk)
            offset += len(chunk)
        slave.become_master()
        for queue_id in range(3):
            expected = master.max_queue_offset("orders", queue_id)
            r = slave.put(Message("orders", b"after"), queue_id)
            assert r.status is PutStatus.PUT_OK and r.queue_offset == expected
            assert slave.wait_dispatched(slave.max_phy_offset)
            got = slave.get_message("g", "orders", queue_id, expected, 1).messages()
            assert [m.body for m in got] == [b"after"]
        assert [m.body for m in slave.query_by_key("orders", "k42")] == [b"m42"]
    finally:
        master.shutdown()
        slave.shutdown()


def set_flushed(root: Path, offset: int) -> None:
    cp = StoreCheckpoint(root / "checkpoint")
    cp.physic_flushed_offset = offset
    cp.flush()
    cp.close()


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in ("lock",)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shutdown", ["clean", "crash"])
@pytest.mark.parametrize("damage", ["crc", "zeroed", "last segment gone"])
def test_damage_below_the_flushed_offset_refuses_to_start_and_changes_nothing(
    tmp_path: Path, shutdown: str, damage: str
) -> None:
    """docs/guarantees.md rule 5, docs/drills.md row 7: below the checkpoint's flushed offset a bad record is not a
    torn tail; cutting there would erase durable records. A master's start stops, naming the
    offset (a slave's cuts there and fetches the rest again from its master: next test)."""
    store = open_store(tmp_path)
    results = [store.put(Message("t", b"m%d" % i * 40), i % 2) for i in range(200)]
    store.shutdown()  # everything flushed: the checkpoint records the log's end
    seg_bytes = 16 * 1024
    last_seg = results[-1].phy_offset // seg_bytes
    in_last = [r for r in results if r.phy_offset // seg_bytes == last_seg]
    victim = in_last[len(in_last) // 2]  # in the last segment: what recovery scans after a crash
    seg = tmp_path / "commitlog" / f"{(victim.phy_offset // seg_bytes) * seg_bytes:020d}"
    if damage == "crc":
        data = bytearray(seg.read_bytes())
        data[victim.phy_offset % seg_bytes + 100] ^= 0x01  # one bit of the body
        seg.write_bytes(bytes(data))
        where = victim.phy_offset
    elif damage == "zeroed":
        data = bytearray(seg.read_bytes())
        pos = victim.phy_offset % seg_bytes
        data[pos:] = bytes(len(data) - pos)
        seg.write_bytes(bytes(data))
        where = victim.phy_offset
    else:
        last = max((tmp_path / "commitlog").iterdir())
        last.unlink()
        where = int(last.name)
    if shutdown == "crash":
        (tmp_path / "abort").write_text("crash")
    before = files_of(tmp_path)
    with pytest.raises(CorruptionError, match=rf"offset {where}:.*below the offset \d+ the "
                                              r"checkpoint records as flushed"):
        open_store(tmp_path)
    assert files_of(tmp_path) == before  # no segment cut, no queue or index touched
    # the store's lock was released: with the damage repaired (here: the checkpoint says
    # nothing was flushed past it), the store starts and cuts there
    set_flushed(tmp_path, where)
    again = open_store(tmp_path)
    try:
        assert again.max_phy_offset == where
    finally:
        again.shutdown()


@pytest.mark.timeout(60)
def test_records_written_without_the_record_crc_survive_a_restart_with_it(tmp_path: Path) -> None:
    # A store written as RocketMQ 4.x writes it (no whole-record CRC), then opened with the
    # defaults: nothing may be cut, and records written from then on are held to the CRC.
    old = open_store(tmp_path, enabledAppendPropCRC=False, forceVerifyPropCRC=False)
    for i in range(50):
        assert old.put(Message("t", b"old%d" % i), 0).ok
    old_end = old.max_phy_offset
    old.shutdown()
    (tmp_path / "abort").write_text("crash")  # make the next start verify everything
    store = open_store(tmp_path)
    try:
        assert store.max_phy_offset == old_end
        assert store.recovery is not None and store.recovery.cut_bytes == 0
        assert store.max_queue_offset("t", 0) == 50
        last = store.put(Message("t", b"new"), 0)
        assert last.ok
        end = store.max_phy_offset
    finally:
        store.shutdown()
    # Tear the new record inside its properties (only the record CRC can tell), as a crash
    # before it was flushed leaves it (the checkpoint then records the flush before it): cut
    # there.
    seg = tmp_path / "commitlog" / f"{(last.phy_offset // (16 * 1024)) * 16 * 1024:020d}"
    data = bytearray(seg.read_bytes())
    pos = last.phy_offset % (16 * 1024)
    data[pos + last.wrote_bytes - 5 : pos + last.wrote_bytes] = bytes(5)
    seg.write_bytes(bytes(data))
    set_flushed(tmp_path, last.phy_offset)
    (tmp_path / "abort").write_text("crash")
    store = open_store(tmp_path)
    try:
        assert store.max_phy_offset == last.phy_offset < end
        assert store.max_queue_offset("t", 0) == 50
    finally:
        store.shutdown()


@pytest.mark.timeout(60)
def test_a_slave_cuts_damage_below_its_flushed_offset_to_fetch_it_again(tmp_path: Path) -> None:
    store = open_store(tmp_path, brokerRole="SLAVE", brokerId=1)
    data = open_store(tmp_path / "src")
    for i in range(50):
        assert data.put(Message("t", b"r%d" % i), 0).ok
    raw = data.read_committed(0, data.max_phy_offset)
    end = data.max_phy_offset
    data.shutdown()
    store.append_replicated(0, raw)
    store.shutdown()
    seg = tmp_path / "commitlog" / f"{0:020d}"
    damaged = bytearray(seg.read_bytes())
    damaged[end // 2 + 3] ^= 0x40
    seg.write_bytes(bytes(damaged))
    # a slave promoted before it stopped resumes as a master: it refuses like one
    (tmp_path / "config" / "promotion.json").write_text("{}")
    assert not promotion.repairs_from_master(True, tmp_path)
    with pytest.raises(CorruptionError, match="below the offset"):
        open_store(tmp_path, brokerRole="SLAVE", brokerId=1, repair_from_master=False)
    (tmp_path / "config" / "promotion.json").unlink()
    assert promotion.repairs_from_master(True, tmp_path)
    again = open_store(tmp_path, brokerRole="SLAVE", brokerId=1, repair_from_master=True)
    try:
        assert 0 < again.max_phy_offset < end // 2 + 3  # cut at the damaged record
    finally:
        again.shutdown()


def test_a_corrupt_replicated_record_does_not_raise_from_inline_dispatch(tmp_path: Path) -> None:
    """The HA client thread indexes what it appended (``dispatch_inline``); a record that fails
    reput's checks must not kill that thread: it returns, the reput thread reports it."""
    slave = open_store(tmp_path / "s", brokerRole="SLAVE", brokerId=1)
    try:
        garbage = (200).to_bytes(4, "big") + b"\xde\xad\xbe\xef" + bytes(192)  # bad magic
        slave.append_replicated(0, garbage)
        assert slave.dispatch_inline() == 0
        assert slave.dispatched_phy_offset == 0  # nothing past the bad record is indexed
    finally:
        slave.end_inline_dispatch()
        slave.shutdown()  # completes (flush, checkpoint, lock released) and keeps the abort file
    assert (tmp_path / "s" / "abort").exists()
    again = open_store(tmp_path / "s", brokerRole="SLAVE", brokerId=1)  # the lock was released
    try:
        assert again.max_phy_offset == 0  # recovery cut the log at the bad record
    finally:
        again.shutdown()


@pytest.mark.timeout(60)
def test_a_record_running_past_its_segment_is_corruption_not_an_unfinished_write(
    tmp_path: Path,
) -> None:
    """Reput used to wait for such a record to 'become whole': forever, while puts kept
    answering PUT_OK for messages no pull could return. Now a master stops taking writes,
    naming the offset."""
    store = open_store(tmp_path)
    try:
        absurd = (0x7FFFFF00).to_bytes(4, "big") + (0xDAA320A7).to_bytes(4, "big") + bytes(192)
        store.append_replicated(0, absurd)  # bytes as a damaged disk would show them
        deadline = time.monotonic() + 10
        while store.commit_log.writeable:
            assert time.monotonic() < deadline, "reput did not report the record"
            time.sleep(0.01)
        r = store.put(Message("t", b"after"), 0)
        assert r.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert "corrupt at offset 0" in r.remark and "runs past the end of segment" in r.remark
    finally:
        store.shutdown()
    # and the next start refuses, naming it (the record lies below the flushed offset)
    with pytest.raises(CorruptionError, match=r"corrupt record at offset 0: size 2147483392"):
        open_store(tmp_path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", ["past the log end", "negative size", "zeroed middle"])
def test_a_damaged_consume_queue_is_rebuilt_from_the_log(tmp_path: Path, damage: str) -> None:
    """An audit found a damaged entry cut the queue there for good: the later messages were
    unreachable and their queue offsets handed out again. Reput now resumes at the cut."""
    store = open_store(tmp_path)
    for i in range(50):
        assert store.put(Message("t", b"m%d" % i), i % 2).ok
    store.shutdown()
    cq = tmp_path / "consumequeue" / "t" / "0" / f"{0:020d}"
    data = bytearray(cq.read_bytes())
    entry = 3 * 20
    if damage == "past the log end":
        data[entry : entry + 8] = (10**9).to_bytes(8, "big")
    elif damage == "negative size":
        data[entry + 8 : entry + 12] = (-5).to_bytes(4, "big", signed=True)
    else:
        data[entry : entry + 20] = bytes(20)
    cq.write_bytes(bytes(data))
    again = open_store(tmp_path)
    try:
        assert again.max_queue_offset("t", 0) == 25
        got = again.get_message("g", "t", 0, 0, 32).messages()
        assert [m.body for m in got] == [b"m%d" % i for i in range(0, 50, 2)]
        r = again.put(Message("t", b"next"), 0)
        assert r.queue_offset == 25  # not an offset the queue already used
    finally:
        again.shutdown()


@pytest.mark.timeout(60)
def test_an_entry_leading_into_the_middle_of_a_record_ends_the_read_there(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        for i in range(10):
            assert store.put(Message("t", b"m%d" % i), 0).ok
        assert store.wait_dispatched(store.max_phy_offset)
        cq = store.cq_store.get("t", 0)
        assert cq is not None
        phy = cq.get(4)[0]
        cq._mfq.files[0].buffer[4 * 20 : 4 * 20 + 8] = (phy + 17).to_bytes(8, "big")
        got = store.get_message("g", "t", 0, 0, 32)
        assert [m.body for m in got.messages()] == [b"m0", b"m1", b"m2", b"m3"]
        assert got.next_begin_offset == 4
        bad = store.get_message("g", "t", 0, 4, 32)
        assert bad.status is GetStatus.CORRUPT_RECORD and bad.records == []
        assert bad.corrupt is not None and bad.corrupt[:2] == (4, phy + 17)
        after = store.get_message("g", "t", 0, 5, 32)  # the rest of the queue is readable
        assert [m.body for m in after.messages()] == [b"m%d" % i for i in range(5, 10)]
        # an entry of a size no record has (it used to be read, then fail to parse)
        cq._mfq.files[0].buffer[6 * 20 + 8 : 6 * 20 + 12] = (12).to_bytes(4, "big")
        tiny = store.get_message("g", "t", 0, 6, 32)
        assert tiny.status is GetStatus.CORRUPT_RECORD
        assert tiny.corrupt is not None and "less than any record" in tiny.corrupt[2]
    finally:
        store.shutdown()
