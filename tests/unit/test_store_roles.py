"""A store that was a slave and becomes a master continues every queue's offsets."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config import load_config
from common.errors import PutStatus
from common.message import Message
from common.store.message_store import MessageStore

pytestmark = pytest.mark.unit


def open_store(root: Path, **over: object) -> MessageStore:
    store = MessageStore(load_config(env={}, storePathRootDir=str(root),
                                     mappedFileSizeCommitLog=16 * 1024,
                                     mappedFileSizeConsumeQueue=20 * 64, maxHashSlotNum=97,
                                     maxIndexNum=400, **over))
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
    # Tear the new record inside its properties (only the record CRC can tell): cut there.
    seg = tmp_path / "commitlog" / f"{(last.phy_offset // (16 * 1024)) * 16 * 1024:020d}"
    data = bytearray(seg.read_bytes())
    pos = last.phy_offset % (16 * 1024)
    data[pos + last.wrote_bytes - 5 : pos + last.wrote_bytes] = bytes(5)
    seg.write_bytes(bytes(data))
    (tmp_path / "abort").write_text("crash")
    store = open_store(tmp_path)
    try:
        assert store.max_phy_offset == last.phy_offset < end
        assert store.max_queue_offset("t", 0) == 50
    finally:
        store.shutdown()


@pytest.mark.timeout(60)
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
