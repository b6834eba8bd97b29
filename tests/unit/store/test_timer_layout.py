"""The timer's files against RocketMQ 5's byte layout (``store/.../timer``: TimerWheel,
TimerLog, TimerCheckpoint), read back here with plain ``struct`` and offsets written out by
hand, not with the modules' own structs: a RocketMQ 5 broker's files and ours read alike."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from common.core.errors import StoreError
from common.store.timer import layout
from common.store.timer.checkpoint import TimerCheckpoint
from common.store.timer.timer_log import TimerLog
from common.store.timer.wheel import EMPTY, TimerWheel

pytestmark = pytest.mark.unit


def test_the_blank_magic_is_rocketmqs() -> None:
    # TimerLog.BLANK_MAGIC_CODE = 0xBBCCDDEE ^ 1880681586 + 8 in Java: + binds first, and the
    # result is a signed int; the same bits as the CommitLog's blank magic
    assert layout.BLANK_MAGIC == -875286124
    assert layout.BLANK_MAGIC & 0xFFFFFFFF == 0xCBD43194
    assert layout.UNIT_SIZE == 52 and layout.SLOT_SIZE == 32 and layout.MIN_BLANK == 16


def test_a_wheel_slot_is_time_over_precision_then_positions_num_and_magic(tmp_path: Path) -> None:
    path = tmp_path / "timerwheel"
    wheel = TimerWheel(path, slots=10, precision_ms=1000)
    wheel.put(123_456_000, 52 * 3, 52 * 9, 4)
    wheel.write(wheel.dirty())
    wheel.close()
    raw = path.read_bytes()
    assert len(raw) == 2 * 10 * 32  # two spans of 10 slots
    index = 123_456 % 20
    at = index * 32
    assert struct.unpack(">q", raw[at:at + 8])[0] == 123_456  # time / precision
    assert struct.unpack(">q", raw[at + 8:at + 16])[0] == 156  # firstPos
    assert struct.unpack(">q", raw[at + 16:at + 24])[0] == 468  # lastPos
    assert struct.unpack(">i", raw[at + 24:at + 28])[0] == 4  # num
    assert struct.unpack(">i", raw[at + 28:at + 32])[0] == 0  # magic
    again = TimerWheel(path, slots=10, precision_ms=1000)
    assert again.slot(123_456_789).num == 4  # any time in the tick finds it
    assert again.slot(123_476_000) == EMPTY  # the same index, another tick
    again.close()
    with pytest.raises(StoreError, match="timerPrecisionMs or the span changed"):
        TimerWheel(path, slots=11, precision_ms=1000)


def test_a_timer_log_unit_is_rocketmqs_52_bytes_and_a_segment_ends_with_a_blank(
        tmp_path: Path) -> None:
    size = 52 * 3 + 20  # three units, then 20 bytes: more than a blank, less than a unit
    log = TimerLog(tmp_path / "timerlog", size)
    log.load()
    positions = [log.append(layout.UNIT.pack(52, p - 52 if p else -1, layout.MAGIC_DEFAULT,
                                             5000, 1500, 4096 + p, 300, -17, 0))
                 for p in (0, 52, 104, 156)]
    assert positions == [0, 52, 104, size]  # the fourth went to the next segment
    log.flush()
    first = (tmp_path / "timerlog" / f"{0:020d}").read_bytes()
    unit = first[52:104]
    assert struct.unpack(">i", unit[0:4])[0] == 52  # size
    assert struct.unpack(">q", unit[4:12])[0] == 0  # prevPos
    assert struct.unpack(">i", unit[12:16])[0] == 1  # magic: default
    assert struct.unpack(">q", unit[16:24])[0] == 5000  # writeTimeMs (the tick)
    assert struct.unpack(">i", unit[24:28])[0] == 1500  # delay
    assert struct.unpack(">q", unit[28:36])[0] == 4096 + 52  # offsetPy
    assert struct.unpack(">i", unit[36:40])[0] == 300  # sizePy
    assert struct.unpack(">i", unit[40:44])[0] == -17  # realTopicHash
    assert struct.unpack(">q", unit[44:52])[0] == 0  # reserved
    blank = first[156:172]
    assert struct.unpack(">iqi", blank) == (20, 0, layout.BLANK_MAGIC)  # length to the end
    assert (tmp_path / "timerlog" / f"{size:020d}").exists()  # named by its start offset
    read = log.read(size)
    assert read is not None and read.offset_py == 4096 + 156 and read.deliver_ms == 6500
    assert log.read(156) is None  # the blank is no unit
    log.shutdown()


def test_timercheck_is_a_page_of_longs_at_rocketmqs_offsets(tmp_path: Path) -> None:
    path = tmp_path / "config" / "timercheck"
    cp = TimerCheckpoint(path, last_read_time_ms=1_700_000_000_000,
                         last_timer_log_flush_pos=52 * 7, last_timer_queue_offset=42,
                         master_timer_queue_offset=40, state_version=3)
    cp.flush()
    raw = path.read_bytes()
    assert len(raw) == 4096
    longs = [struct.unpack(">q", raw[i:i + 8])[0] for i in range(0, 56, 8)]
    assert longs[:5] == [1_700_000_000_000, 364, 42, 40, 3]
    assert longs[5] > 0 and longs[6] == 1  # the data version's timestamp and counter
    back = TimerCheckpoint.load(path)
    assert (back.last_read_time_ms, back.last_timer_log_flush_pos,
            back.last_timer_queue_offset) == (1_700_000_000_000, 364, 42)
    path.write_bytes(raw[:100])
    with pytest.raises(StoreError, match="a timer checkpoint is 4096"):
        TimerCheckpoint.load(path)


def test_a_first_checkpoint_is_a_whole_page_or_none_and_an_empty_file_is_a_new_one(
        tmp_path: Path) -> None:
    """A kill between the file's creation and its first write left an empty timercheck, and the
    broker refused to start on it (the clock-skew drill found it: a kill 1.5 s after a first
    start). The first page is now renamed into place; an empty file reads as a new one (it
    claims nothing); a later page is written in place."""
    path = tmp_path / "config" / "timercheck"
    path.parent.mkdir()
    path.write_bytes(b"")  # what the old flush could leave
    assert TimerCheckpoint.load(path).last_read_time_ms == 0
    path.unlink()
    cp = TimerCheckpoint(path, last_read_time_ms=5)
    cp.flush()  # the first: a whole page, renamed into place
    assert path.stat().st_size == 4096
    cp.last_read_time_ms = 6
    cp.flush()  # in place
    assert TimerCheckpoint.load(path).last_read_time_ms == 6
    assert sorted(p.name for p in path.parent.iterdir()) == ["timercheck"]  # no temp left
