"""CommitLog bytes on disk, read by an independent decoder; put statuses; replicated appends;
the store lock; configuration loading.

``walk_log`` / ``decode_record`` below parse the segment files with plain ``open``, ``int.from_bytes``
and ``zlib`` at the offsets of RocketMQ 4.x's v1 record (reference section 1.1), never through
``common.format.record``: a bug shared by the encoder and the production decoder cannot hide.
With ``enabledAppendPropCRC`` (the default) the properties end with RocketMQ 5's reserved
``__CRC32#\x01`` + 10 digits (least significant first) + ``\x02`` entry: the crc32 of the whole
record except those 20 bytes; the decoder checks it and strips it from ``props``.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from common.core.config import BrokerConfig, load_config
from common.core.errors import ConfigError, GetStatus, PutStatus, StoreError
from common.core.message import Message
from common.store.commit_log import PutResult
from common.store.message_store import MessageStore

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
FIXED = 91  # 84 header bytes + 4 body length + 1 topic length + 2 properties length
SEG = 4096  # smallest segment the config accepts: many rolls with few messages
STORE_IP = "192.168.7.9"
STORE_PORT = 10911
BORN = ("10.1.2.3", 4567)
BORN_TS = 1_700_000_000_123


# ---- independent decoder -------------------------------------------------------------------
def _int(buf: bytes, off: int, size: int, signed: bool = True) -> int:
    return int.from_bytes(buf[off : off + size], "big", signed=signed)


@dataclass
class Rec:
    phy: int
    total: int
    magic: int
    crc: int
    queue_id: int
    flag: int
    queue_offset: int
    phy_field: int
    sys_flag: int
    born_ts: int
    born_ip: str
    born_port: int
    store_ts: int
    store_ip: str
    store_port: int
    reconsume: int
    prepared: int
    body: bytes
    topic: str
    props_raw: bytes  # without the whole-record CRC entry
    sealed: bool = False  # carried a (checked) whole-record CRC entry

    @property
    def props(self) -> dict[str, str]:
        if not self.props_raw:
            return {}
        text = self.props_raw.decode("utf-8")
        assert text.endswith("\x02"), f"properties at {self.phy} lack the trailing \\x02"
        out = {}
        for item in text[:-1].split("\x02"):
            name, sep, value = item.partition("\x01")
            assert sep and name, f"bad property item {item!r} at {self.phy}"
            out[name] = value
        return out


def decode_record(buf: bytes, pos: int, phy: int) -> Rec:
    """Decode and check one v1 record at ``pos`` of a segment that starts at ``phy - pos``."""
    total = _int(buf, pos, 4)
    body_len = _int(buf, pos + 84, 4)
    body = buf[pos + 88 : pos + 88 + body_len]
    p = pos + 88 + body_len
    topic_len = buf[p]
    topic = buf[p + 1 : p + 1 + topic_len]
    p += 1 + topic_len
    props_len = _int(buf, p, 2, signed=False)
    props = buf[p + 2 : p + 2 + props_len]
    sealed = len(props) >= 20 and props[-20:-11] == b"__CRC32#\x01" and props[-1:] == b"\x02"
    if sealed:
        digits = props[-11:-1]
        assert digits.isdigit(), f"CRC digits {digits!r} at {phy}"
        whole = zlib.crc32(buf[pos : pos + total - 20]) & 0x7FFFFFFF
        assert int(digits[::-1]) == whole, f"whole-record CRC at {phy}"
        props = props[:-20]
    rec = Rec(
        phy=phy, total=total, magic=_int(buf, pos + 4, 4, signed=False),
        crc=_int(buf, pos + 8, 4), queue_id=_int(buf, pos + 12, 4), flag=_int(buf, pos + 16, 4),
        queue_offset=_int(buf, pos + 20, 8), phy_field=_int(buf, pos + 28, 8),
        sys_flag=_int(buf, pos + 36, 4), born_ts=_int(buf, pos + 40, 8),
        born_ip=socket.inet_ntoa(buf[pos + 48 : pos + 52]), born_port=_int(buf, pos + 52, 4),
        store_ts=_int(buf, pos + 56, 8), store_ip=socket.inet_ntoa(buf[pos + 64 : pos + 68]),
        store_port=_int(buf, pos + 68, 4), reconsume=_int(buf, pos + 72, 4),
        prepared=_int(buf, pos + 76, 8), body=body, topic=topic.decode("utf-8"),
        props_raw=props, sealed=sealed,
    )
    assert rec.magic == MAGIC, f"magic 0x{rec.magic:08X} at {phy}"
    assert p + 2 + props_len - pos == total == FIXED + body_len + topic_len + props_len
    assert rec.crc == zlib.crc32(body) & 0x7FFFFFFF, f"body CRC at {phy}"
    assert rec.phy_field == phy, f"PHYSICALOFFSET {rec.phy_field} at position {phy}"
    return rec


@dataclass
class LogImage:
    records: list[Rec]
    blanks: list[tuple[int, int]]  # (phy offset, TOTALSIZE) of each BLANK
    end: int  # offset after the last record (or blank)
    segments: list[int]  # start offsets of the segment files


def walk_log(commitlog_dir: Path, file_size: int) -> LogImage:
    """Every record of every segment; segment names, sizes, BLANKs and zero tails checked."""
    names = sorted(n for n in os.listdir(commitlog_dir) if not n.startswith("."))  # hidden: being created
    starts = []
    for name in names:
        assert re.fullmatch(r"[0-9]{20}", name), f"segment name {name!r}"
        starts.append(int(name))
    if starts:
        assert starts == [starts[0] + i * file_size for i in range(len(starts))], starts
        assert starts[0] % file_size == 0
    records: list[Rec] = []
    blanks: list[tuple[int, int]] = []
    end = starts[0] if starts else 0
    ended = False
    for start in starts:
        data = (commitlog_dir / f"{start:020d}").read_bytes()
        assert len(data) == file_size, f"segment {start:020d} has {len(data)} bytes"
        if ended:
            assert not any(data), f"bytes after the log's end in segment {start:020d}"
            continue
        pos = 0
        while True:
            assert file_size - pos >= 8, f"{file_size - pos} bytes left at the end of {start}"
            total = _int(data, pos, 4)
            magic = _int(data, pos + 4, 4, signed=False)
            if magic == BLANK_MAGIC:
                assert total == file_size - pos, f"BLANK at {start + pos} claims {total}"
                blanks.append((start + pos, total))
                end = start + file_size
                break
            if total == 0 and magic == 0:
                assert not any(data[pos:]), f"garbage after the end at {start + pos}"
                end = start + pos
                ended = True
                break
            rec = decode_record(data, pos, start + pos)
            assert pos + rec.total + 8 <= file_size, f"record at {start + pos} leaves < 8 bytes"
            records.append(rec)
            pos += rec.total
            end = start + pos
    return LogImage(records, blanks, end, starts)


def msg_id_of(ip: str, port: int, phy: int) -> str:
    return (socket.inet_aton(ip) + port.to_bytes(4, "big") + phy.to_bytes(8, "big")).hex().upper()


# ---- store helpers ---------------------------------------------------------------------------
def make_cfg(root: Path, **kw: Any) -> BrokerConfig:
    base: dict[str, Any] = {
        "storePathRootDir": str(root), "mappedFileSizeCommitLog": SEG,
        "mappedFileSizeConsumeQueue": 20 * 32, "brokerIP1": STORE_IP, "listenPort": STORE_PORT,
        "maxHashSlotNum": 64, "maxIndexNum": 512,
    }
    base.update(kw)
    return load_config(env={}, **base)


@contextmanager
def running(cfg: BrokerConfig) -> Iterator[MessageStore]:
    store = MessageStore(cfg)
    store.start()
    try:
        yield store
    finally:
        store.shutdown()


def commitlog(root: Path) -> Path:
    return root / "commitlog"


@dataclass
class Sent:
    msg: Message
    queue_id: int
    phy: int
    size: int  # 0 when only known as part of a batch


def random_message(rng: random.Random, topic: str) -> Message:
    body = rng.randbytes(rng.choice([0, 1, 17, 128, 700, 1500, rng.randrange(2000)]))
    props = {f"p{j}": rng.choice(["", "v", "välue", "x" * 40]) for j in range(rng.randrange(3))}
    return Message(
        topic, body,
        tags=rng.choice([None, "TagA", "TagB"]),
        keys=rng.choice([None, f"k{rng.randrange(10**6)}", [f"a{rng.randrange(99)}", "b"]]),
        properties=props, flag=rng.choice([0, 1, 0x7FFFFFFF, -5]),
    )


# ---- every field of every record -------------------------------------------------------------
def test_every_field_of_every_record_across_segment_rolls(tmp_path: Path) -> None:
    rng = random.Random(20261121)
    sent: list[Sent] = []
    with running(make_cfg(tmp_path)) as store:
        t0 = time.time_ns() // 1_000_000
        for i in range(160):
            topic = rng.choice(["TopicA", "TopicB", "%RETRY%g|x-y_z"])
            qid = rng.randrange(3)
            if i % 20 == 7:
                msgs = [random_message(rng, topic) for _ in range(rng.randrange(2, 6))]
                for m in msgs:
                    m.body = m.body[:300]
                r = store.put_batch(topic, qid, msgs, born_host=BORN, born_timestamp=BORN_TS)
                assert r.status is PutStatus.PUT_OK, r.remark
                assert r.msg_count == len(msgs) and len(r.record_offsets) == len(msgs)
                sent += [Sent(m, qid, off, 0) for m, off in zip(msgs, r.record_offsets)]
            else:
                m = random_message(rng, topic)
                r = store.put(m, qid, born_host=BORN, born_timestamp=BORN_TS + i)
                assert r.status is PutStatus.PUT_OK, r.remark
                sent.append(Sent(m, qid, r.phy_offset, r.wrote_bytes))
        t1 = time.time_ns() // 1_000_000
        live = walk_log(commitlog(tmp_path), SEG)  # preallocated segments must be all zero
        end = store.max_phy_offset
    image = walk_log(commitlog(tmp_path), SEG)
    assert [r.phy for r in live.records] == [r.phy for r in image.records]
    assert image.end == end == live.end
    assert len(image.segments) >= 8 and len(image.blanks) >= 6

    assert len(image.records) == len(sent)
    next_qoff: dict[tuple[str, int], int] = {}
    last_ts = 0
    for i, (rec, s) in enumerate(zip(image.records, sent, strict=True)):
        m = s.msg
        assert rec.phy == s.phy
        if s.size:
            assert rec.total == s.size
        assert rec.topic == m.topic and rec.queue_id == s.queue_id
        assert rec.body == m.body and rec.flag == m.flag
        assert rec.props == m.all_properties() and rec.sealed
        key = (m.topic, s.queue_id)
        assert rec.queue_offset == next_qoff.get(key, 0), f"record {i}: queue offsets not dense"
        next_qoff[key] = rec.queue_offset + 1
        assert rec.sys_flag == 0 and rec.reconsume == 0 and rec.prepared == 0
        assert rec.born_ip == BORN[0] and rec.born_port == BORN[1]
        assert BORN_TS <= rec.born_ts < BORN_TS + 200
        assert (rec.store_ip, rec.store_port) == (STORE_IP, STORE_PORT)
        assert t0 <= rec.store_ts <= t1 and rec.store_ts >= last_ts
        last_ts = rec.store_ts
    # Records are contiguous inside a segment; a BLANK appears exactly when the next record
    # plus 8 bytes did not fit in what was left.
    by_phy = {r.phy: r for r in image.records}
    for rec in image.records:
        nxt = rec.phy + rec.total
        assert nxt in by_phy or nxt == image.end or any(b[0] == nxt for b in image.blanks)
    for blank_at, left in image.blanks:
        following = by_phy[blank_at + left]  # the record that went to the next segment
        assert (blank_at + left) % SEG == 0
        batch_end = following.phy
        while batch_end in by_phy and by_phy[batch_end].store_ts == following.store_ts \
                and by_phy[batch_end].born_ts == following.born_ts:
            batch_end += by_phy[batch_end].total  # a batch moves as one block
        assert (batch_end - following.phy) + 8 > left, f"needless BLANK at {blank_at}"


@pytest.mark.parametrize(("prop_crc", "size"), [(False, 158), (True, 178)])
def test_rocketmq_golden_record_size(tmp_path: Path, prop_crc: bool, size: int) -> None:
    """RocketMQ's ReputMessageServiceTest: FooBar, 32-byte body, KEYS + TAGS -> 158 bytes
    (4.x, no whole-record CRC); the reserved CRC property adds 20 bytes."""
    cfg = make_cfg(tmp_path, mappedFileSizeCommitLog=1 << 20, enabledAppendPropCRC=prop_crc,
                   forceVerifyPropCRC=prop_crc)
    with running(cfg) as store:
        for i in range(10):
            r = store.put(Message("FooBar", bytes(range(32)), tags="TAG1",
                                  keys=f"{1_700_000_000_000 + i}"), 0)
            assert r.status is PutStatus.PUT_OK and r.wrote_bytes == size
            assert r.phy_offset == size * i
        assert store.max_phy_offset == 10 * size
    image = walk_log(commitlog(tmp_path), 1 << 20)
    assert [(r.total, r.sealed) for r in image.records] == [(size, prop_crc)] * 10
    assert image.records[3].props == {"TAGS": "TAG1", "KEYS": "1700000000003"}
    assert image.end == 10 * size


def test_msg_id_is_store_ip_port_offset_in_upper_hex(tmp_path: Path) -> None:
    with running(make_cfg(tmp_path)) as store:
        r = store.put(Message("TopicA", b"a" * 100), 1)
        r2 = store.put(Message("TopicA", b"b" * 100), 1)
        rb = store.put_batch("TopicA", 2, [Message("TopicA", b"c"), Message("TopicA", b"d")])
        assert r.msg_id == msg_id_of(STORE_IP, STORE_PORT, 0) == "C0A80709" + "00002A9F" + "0" * 16
        assert r2.msg_id == msg_id_of(STORE_IP, STORE_PORT, r.wrote_bytes)
        assert re.fullmatch(r"[0-9A-F]{32}", r2.msg_id)
        assert rb.msg_ids == tuple(msg_id_of(STORE_IP, STORE_PORT, o) for o in rb.record_offsets)
        found = store.message_by_msg_id(r2.msg_id)
        assert found is not None and found.body == b"b" * 100 and found.msg_id == r2.msg_id


# ---- put statuses ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("topic", "body", "props", "status"),
    [
        ("T" * 127, b"x", {}, PutStatus.PUT_OK),
        ("T" * 128, b"x", {}, PutStatus.MESSAGE_ILLEGAL),
        ("", b"x", {}, PutStatus.MESSAGE_ILLEGAL),
        ("TopicA", b"x" * 2048, {}, PutStatus.PUT_OK),
        ("TopicA", b"x" * 2049, {}, PutStatus.MESSAGE_ILLEGAL),
        ("TopicA", b"", {"k": "v" * (32767 - 20 - 3)}, PutStatus.PUT_OK),
        ("TopicA", b"", {"k": "v" * (32767 - 20 - 2)}, PutStatus.PROPERTIES_SIZE_EXCEEDED),
    ],
    ids=["topic127", "topic128", "empty-topic", "body-at-max", "body-over-max",
         "props-32767-with-crc", "props-32768-with-crc"],
)
def test_put_statuses(tmp_path: Path, topic: str, body: bytes, props: dict[str, str],
                      status: PutStatus) -> None:
    cfg = make_cfg(tmp_path, maxMessageSize=2048, mappedFileSizeCommitLog=1 << 16)
    with running(cfg) as store:
        before = store.max_phy_offset
        r = store.put(Message(topic, body, properties=props), 0)
        assert r.status is status, r.remark
        rb = store.put_batch(topic, 0, [Message(topic, b"ok"), Message(topic, body,
                                                                       properties=props)])
        assert rb.status is status, rb.remark
        if not props:  # the same bodies as plain bytes take the store's Message-free path
            rp = store.put_batch(topic, 0, [b"ok", body])
            assert (rp.status, rp.remark) == (rb.status, rb.remark)
        if status is not PutStatus.PUT_OK:
            assert r.remark and store.max_phy_offset == before  # nothing written
            assert r.msg_id == "" and rb.msg_ids == ()
    if status is PutStatus.PUT_OK:
        recs = walk_log(commitlog(tmp_path), 1 << 16).records
        assert [len(r.props_raw) for r in recs][-1] == len(
            b"".join(f"{k}\x01{v}\x02".encode() for k, v in props.items()))
    else:
        assert walk_log(commitlog(tmp_path), 1 << 16).records == []


@pytest.mark.parametrize("prop_crc", [True, False])
def test_batch_of_plain_bodies_writes_the_records_a_message_batch_writes(
    tmp_path: Path, prop_crc: bool
) -> None:
    bodies = [b"", b"a", b"x" * 700, bytes(range(256))]
    cfg = {"mappedFileSizeCommitLog": 1 << 16, "enabledAppendPropCRC": prop_crc,
           "forceVerifyPropCRC": prop_crc}
    with running(make_cfg(tmp_path / "m", **cfg)) as store:
        assert store.put_batch("TopicA", 3, [Message("TopicA", b) for b in bodies]).ok
    with running(make_cfg(tmp_path / "b", **cfg)) as store:
        assert store.put_batch("TopicA", 3, [*bodies]).ok
    as_msgs = walk_log(commitlog(tmp_path / "m"), 1 << 16).records
    as_bytes = walk_log(commitlog(tmp_path / "b"), 1 << 16).records
    assert len(as_bytes) == len(bodies)
    for a, b in zip(as_msgs, as_bytes, strict=True):
        # equal but for the timestamps (and the record CRC, which covers them)
        assert (a.total, a.crc, a.queue_id, a.flag, a.queue_offset, a.phy_field, a.body,
                a.topic, a.props_raw, a.sealed) == (b.total, b.crc, b.queue_id, b.flag,
                                                    b.queue_offset, b.phy_field, b.body, b.topic,
                                                    b.props_raw, b.sealed)
        assert a.sealed is prop_crc


@pytest.mark.parametrize(("length", "status"), [(32767, PutStatus.PUT_OK),
                                                 (32768, PutStatus.PROPERTIES_SIZE_EXCEEDED)])
def test_properties_limit_without_the_record_crc(tmp_path: Path, length: int,
                                                 status: PutStatus) -> None:
    cfg = make_cfg(tmp_path, mappedFileSizeCommitLog=1 << 16, enabledAppendPropCRC=False,
                   forceVerifyPropCRC=False)
    with running(cfg) as store:
        r = store.put(Message("TopicA", b"", properties={"k": "v" * (length - 3)}), 0)
        assert r.status is status, r.remark
    recs = walk_log(commitlog(tmp_path), 1 << 16).records
    assert [len(r.props_raw) for r in recs] == ([length] if r.ok else [])


def test_put_after_shutdown_is_service_not_available(tmp_path: Path) -> None:
    store = MessageStore(make_cfg(tmp_path))
    store.start()
    assert store.put(Message("TopicA", b"x"), 0).status is PutStatus.PUT_OK
    store.shutdown()
    r = store.put(Message("TopicA", b"y"), 0)
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE and r.remark
    rb = store.put_batch("TopicA", 0, [Message("TopicA", b"z")])
    assert rb.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert len(walk_log(commitlog(tmp_path), SEG).records) == 1


# ---- replicated appends ------------------------------------------------------------------------
def _fill_master(store: MessageStore, rng: random.Random, count: int) -> None:
    for i in range(count):
        r = store.put(Message("TopicR", rng.randbytes(rng.randrange(50, 900)), keys=f"r{i}"),
                      i % 2)
        assert r.status is PutStatus.PUT_OK


def _log_bytes(root: Path, upto: int) -> bytes:
    data = b"".join(p.read_bytes() for p in sorted(commitlog(root).iterdir())
                    if not p.name.startswith("."))  # hidden: being created
    return data[:upto]


def test_append_replicated_byte_identical_across_segments(tmp_path: Path) -> None:
    rng = random.Random(5)
    master_root, slave_root = tmp_path / "m", tmp_path / "s"
    with running(make_cfg(master_root)) as master, \
            running(make_cfg(slave_root, brokerRole="SLAVE", brokerId=1)) as slave:
        _fill_master(master, rng, 40)
        end = master.max_phy_offset
        assert end > 3 * SEG
        pos = 0
        while pos < end:  # chunks of random size, not aligned to records or segments
            chunk = master.read_committed(pos, rng.randrange(1, 3000))
            assert chunk
            assert slave.append_replicated(pos, chunk) == pos + len(chunk)
            pos += len(chunk)
        assert slave.max_phy_offset == end
        assert _log_bytes(slave_root, end) == _log_bytes(master_root, end)
        assert slave.wait_dispatched(end)
        g = slave.get_message("g", "TopicR", 1, 0, 64)
        assert g.status is GetStatus.FOUND and len(g.records) == 20
        assert [m.queue_offset for m in g.messages()] == list(range(20))


def test_append_replicated_refuses_gap_and_overlap(tmp_path: Path) -> None:
    rng = random.Random(6)
    with running(make_cfg(tmp_path / "m")) as master, \
            running(make_cfg(tmp_path / "s", brokerRole="SLAVE", brokerId=1)) as slave:
        _fill_master(master, rng, 12)
        data = master.read_committed(0, SEG)
        half = len(data) // 2
        slave.append_replicated(0, data[:half])
        before = _log_bytes(tmp_path / "s", SEG)
        with pytest.raises(StoreError, match="gap"):
            slave.append_replicated(half + 1, data[half + 1 :])
        with pytest.raises(StoreError, match="overlap"):
            slave.append_replicated(half - 1, data[half - 1 :])
        with pytest.raises(StoreError, match="overlap"):
            slave.append_replicated(0, data)
        assert slave.max_phy_offset == half
        assert _log_bytes(tmp_path / "s", SEG) == before  # nothing written by a refusal
        slave.append_replicated(half, data[half:])
        assert _log_bytes(tmp_path / "s", len(data)) == data


def test_empty_slave_starts_at_the_masters_first_offset(tmp_path: Path) -> None:
    rng = random.Random(7)
    with running(make_cfg(tmp_path / "m")) as master:
        _fill_master(master, rng, 30)
        start = 2 * SEG
        tail = b"".join(master.read_committed(o, SEG) for o in range(start, master.max_phy_offset,
                                                                      SEG))
        end = master.max_phy_offset
    with running(make_cfg(tmp_path / "s", brokerRole="SLAVE", brokerId=1)) as slave:
        assert slave.append_replicated(start, tail) == end
        assert slave.min_phy_offset == start and slave.max_phy_offset == end
        assert min(p.name for p in commitlog(tmp_path / "s").iterdir()
                   if not p.name.startswith(".")) == f"{start:020d}"  # hidden: being created
        msg = slave.message_by_offset(start)
        assert msg is not None and msg.commit_log_offset == start


# ---- one store per directory ------------------------------------------------------------------
def test_second_store_in_the_same_process_refuses_to_start(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    with running(cfg) as store:
        assert store.put(Message("TopicA", b"one"), 0).ok
        other = MessageStore(cfg)
        with pytest.raises(StoreError, match="already in use"):
            other.start()
        assert (tmp_path / "abort").exists()  # the refused start did not touch the running one
        assert store.put(Message("TopicA", b"two"), 0).ok
    assert [r.body for r in walk_log(commitlog(tmp_path), SEG).records] == [b"one", b"two"]


HOLDER = textwrap.dedent("""
    import sys
    from common.core.config import load_config
    from common.store.message_store import MessageStore
    store = MessageStore(load_config(env={}, storePathRootDir=sys.argv[1],
                                     mappedFileSizeCommitLog=4096, maxHashSlotNum=64,
                                     maxIndexNum=512))
    try:
        store.start()
    except Exception as e:
        print("REFUSED", e, flush=True)
        sys.exit(3)
    print("STARTED", flush=True)
    sys.stdin.readline()
    store.shutdown()
""")


def _spawn_holder(root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)


@pytest.mark.timeout(60)
def test_second_store_in_another_process_refuses_to_start(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    with running(cfg):
        child = _spawn_holder(tmp_path)
        try:
            out, _ = child.communicate(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == 3 and out.startswith("REFUSED") and "already in use" in out
    child = _spawn_holder(tmp_path)  # now the other process holds it
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "STARTED"
        with pytest.raises(StoreError, match=f"pid {child.pid}"):
            MessageStore(cfg).start()
        os.kill(child.pid, signal.SIGKILL)  # a crash releases the lock with the process
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()
    with running(cfg) as store:
        assert store.recovery is not None and store.recovery.abnormal


# ---- configuration -------------------------------------------------------------------------------
def test_unknown_key_is_refused_by_name_with_the_closest_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'mappedFileSizeComitLog'.*'mappedFileSizeCommitLog'"):
        load_config(env={}, overrides=["mappedFileSizeComitLog=4096"])
    conf = tmp_path / "broker.yaml"
    conf.write_text("brokerName: b1\nflushDiskTyp: SYNC_FLUSH\n")
    with pytest.raises(ConfigError, match=r"'flushDiskTyp'.*'flushDiskType'"):
        load_config(conf, env={})
    with pytest.raises(ConfigError, match=r"'warmMappedFileEnable'.*'warmMapedFileEnable'"):
        load_config(env={"REPLOG_warmMappedFileEnable": "true"})
    with pytest.raises(ConfigError, match=r"unknown config key 'zzzqqq'"):
        load_config(env={}, overrides=["zzzqqq=1"])
    with pytest.raises(ConfigError, match=r"'listenport'.*'listenPort'"):
        load_config(env={"REPLOG_listenport": "1"})
    with pytest.raises(ConfigError, match=r"groupServers.*'nohost' is not host:port"):
        load_config(env={}, groupServers="127.0.0.1:10921,nohost")
    assert load_config(env={}, groupServers=" a:1, b:2 ").groupServers == " a:1, b:2 "


def test_tools_own_upper_case_environment_is_not_config() -> None:
    """REPLOG_DEMO_DURATION (make run), REPLOG_BENCH_SCALE... belong to the tools: a broker
    started with them set still starts."""
    cfg = load_config(env={"REPLOG_DEMO_DURATION": "5", "REPLOG_BENCH_SCALE": "0.3",
                           "REPLOG_listenPort": "30911"})
    assert cfg.listenPort == 30911


def test_overrides_precedence_and_types(tmp_path: Path) -> None:
    conf = tmp_path / "broker.yaml"
    conf.write_text("listenPort: 20911\nflushDiskType: SYNC_FLUSH\nwarmMapedFileEnable: false\n"
                    "deleteWhen: 04\nmappedFileSizeCommitLog: 65536\n")
    cfg = load_config(conf, env={"REPLOG_listenPort": "30911", "REPLOG_warmMapedFileEnable": "true",
                                 "OTHER_listenPort": "1"},
                      overrides=["listenPort=40911", "brokerName=b-x"])
    assert cfg.listenPort == 40911 and cfg.warmMapedFileEnable is True
    assert cfg.flushDiskType == "SYNC_FLUSH" and cfg.sync_flush
    assert cfg.mappedFileSizeCommitLog == 65536 and cfg.brokerName == "b-x"
    assert cfg.deleteWhen in ("04", "4")
    env_only = load_config(conf, env={"REPLOG_listenPort": "30911"})
    assert env_only.listenPort == 30911
    assert load_config(env={}).mappedFileSizeCommitLog == 1024 * 1024 * 1024


@pytest.mark.parametrize(
    ("source", "key"),
    [
        ({"overrides": ["listenPort=abc"]}, "listenPort"),
        ({"overrides": ["warmMapedFileEnable=maybe"]}, "warmMapedFileEnable"),
        ({"overrides": ["mappedFileSizeCommitLog=1.5"]}, "mappedFileSizeCommitLog"),
        ({"env": {"REPLOG_syncFlushTimeout": "[1, 2]"}}, "syncFlushTimeout"),
        ({"overrides": ["flushDiskType=SOMETIMES"]}, "flushDiskType"),
        ({"overrides": ["mappedFileSizeConsumeQueue=30"]}, "mappedFileSizeConsumeQueue"),
        ({"yaml": "maxMessageSize: big\n"}, "maxMessageSize"),
        ({"yaml": "messageIndexEnable: 1\n"}, "messageIndexEnable"),
    ],
)
def test_ill_typed_values_are_refused_by_name(tmp_path: Path, source: dict[str, Any],
                                              key: str) -> None:
    kwargs: dict[str, Any] = {"env": source.get("env", {}),
                              "overrides": source.get("overrides", [])}
    path = None
    if "yaml" in source:
        path = tmp_path / "broker.yaml"
        path.write_text(source["yaml"])
    with pytest.raises(ConfigError, match=re.escape(repr(key))):
        load_config(path, **kwargs)


def test_set_without_equals_is_refused() -> None:
    with pytest.raises(ConfigError, match="key=value"):
        load_config(env={}, overrides=["listenPort"])


def test_result_fields_are_consistent(tmp_path: Path) -> None:
    with running(make_cfg(tmp_path)) as store:
        r: PutResult = store.put(Message("TopicA", b"x" * 10), 3)
        assert (r.queue_id, r.queue_offset, r.msg_count) == (3, 0, 1)
        assert r.end_phy_offset == r.phy_offset + r.wrote_bytes == store.max_phy_offset
