"""Reput's record scan in C against the Python loop: the same dispatches, in the same order.

``ReputService._dispatch_pass`` hands the plain records to ``common.store._reput_scan`` when it
is built and reads every other record itself. Each test here dispatches one CommitLog twice,
with the C scan and without it (the pure-Python loop, as where the extension is not built),
digests off so every record is parsed, and compares everything the store was told.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from common.core.errors import CorruptionError
from common.core.message import PROPERTY_UNIQ_KEY, Message
from common.store import reput as reput_module
from common.store.commit_log import CommitLog
from common.store.extensions import StoreExtensions
from common.store.reput import DispatchRequest, ReputService

pytestmark = pytest.mark.unit

native = pytest.importorskip("common.store._reput_scan",
                             reason="the C reput scan is not built here")


class Recorder:
    """A DispatchTarget that writes down what it is told."""

    def __init__(self, log: CommitLog):
        self.commit_log = log
        self.dispatched_phy_offset = 0
        self.extensions = StoreExtensions()
        self.extensions.add_dispatcher(self)
        # a feature's property, and a topic whose tags code a rule gives
        self.extensions.watch("WATCHED")
        self.extensions.add_tags_code_rule(
            "ruled", lambda props, ts, code: code + len(props), ("RULED",))
        self.calls: list[tuple[Any, ...]] = []

    name = "recorder"
    watches = ()

    def dispatch(self, req: DispatchRequest) -> None:  # as a record dispatcher
        if req.keys or req.properties:
            self.calls.append(("index", req))

    def reput_end(self) -> int:
        return self.commit_log.max_offset

    def dispatch_cq(self, topic: str, queue_id: int, first: int,
                    entries: list[tuple[int, int, int]], packed: bytes = b"") -> None:
        self.calls.append(("cq", topic, queue_id, first, list(entries)))

    def note_dispatched_timestamp(self, ts: int) -> None:
        self.calls.append(("ts", ts))

    def on_dispatch_corruption(self, e: CorruptionError) -> None:
        self.calls.append(("corrupt", e.phy_offset))


def fill(log: CommitLog, seed: int) -> None:
    """Two topics, three queues, interleaved; plain puts and batches, tagged, keyed and
    delayed ones; over several 16 KiB segments (BLANK ends)."""
    rnd = random.Random(seed)
    for i in range(400):
        topic = rnd.choice(["orders", "payments-eu"])
        queue_id = rnd.randrange(3)
        body = b"%d-" % i + b"x" * rnd.randrange(0, 600)
        kind = rnd.random()
        if kind < 0.35:
            assert log.put(Message(topic, body), queue_id).ok
        elif kind < 0.7:
            assert log.put_batch(topic, queue_id, [body] * rnd.randrange(1, 12)).ok
        elif kind < 0.8:
            assert log.put(Message(topic, body, tags=f"T{i % 4}"), queue_id).ok
        elif kind < 0.9:
            assert log.put(Message(topic, body, keys=f"k{i} j{i}"), queue_id).ok
        elif kind < 0.95:
            assert log.put_batch(topic, queue_id, [Message(topic, body, keys=f"b{i}"), body]).ok
        else:  # what the official clients send (a message id), and properties reput reads
            props = rnd.choice([{PROPERTY_UNIQ_KEY: f"id-{i}"}, {"color": "blue"},
                                {"xKEYS": "not a key", "é": "日本"}, {"WATCHED": "1"},
                                {PROPERTY_UNIQ_KEY: "", "KEYS": "  a b  "}, {"RULED": "x"}])
            if rnd.random() < 0.5:
                topic = "ruled"
            msg = Message(topic, body, tags=rnd.choice([None, "T", "🙂x"]),
                          keys=rnd.choice([None, f"k{i}"]), properties=props)
            for _ in range(rnd.randrange(1, 4)):  # runs of them, one after another
                assert log.put(msg, queue_id).ok


def dispatch(log: CommitLog, scan: Any, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    monkeypatch.setattr(reput_module, "_scan", scan)
    target = Recorder(log)
    service = ReputService(target)  # type: ignore[arg-type]
    arrivals: list[tuple[str, int, int]] = []
    service.arrival_listeners.append(lambda t, q, o: arrivals.append((t, q, o)))
    try:
        while service.do_reput():
            pass
    except CorruptionError as e:
        target.calls.append(("raised", e.phy_offset))
    target.calls.append(("arrivals", arrivals))
    target.calls.append(("end", target.dispatched_phy_offset))
    return target


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    log = CommitLog(tmp_path / "commitlog", 16 * 1024, max_message_size=4096)
    log.load()
    monkeypatch.setattr(log, "take_digest_run", lambda phy, end, most: None)  # parse all
    yield log
    log.shutdown()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_c_scan_dispatches_what_the_python_loop_dispatches(
        log: CommitLog, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    fill(log, seed)
    assert log.max_offset > 10 * 16 * 1024
    taken: list[int] = []
    read: list[Any] = []  # records with properties C read for the dispatchers

    class Counting:
        @staticmethod
        def scan(*args: Any) -> Any:
            result = native.scan(*args)
            taken.append(result[2])
            if result[4] is not None:
                read.append(result[4])
            return result

    with_c = dispatch(log, Counting, monkeypatch)
    assert sum(taken) > 600, "the C scan took few records"
    assert len(read) > 30, "the C scan read few records with properties"
    python = dispatch(log, None, monkeypatch)
    assert with_c.calls == python.calls
    assert with_c.dispatched_phy_offset == log.max_offset
    kinds = {c[0] for c in python.calls}
    assert {"cq", "index", "ts"} <= kinds


def test_a_corrupt_record_stops_both_at_the_same_offset_after_the_same_dispatches(
        log: CommitLog, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(log, 4)
    records = [phy for phy, _ in log.iter_records(0, log.max_offset)]
    victim = records[len(records) // 2]
    mf = log.queue.find(victim)
    assert mf is not None
    mf.buffer[victim - mf.file_from_offset + 4] ^= 0xFF  # the magic
    with_c = dispatch(log, native, monkeypatch)
    python = dispatch(log, None, monkeypatch)
    assert ("raised", victim) in python.calls
    assert with_c.calls == python.calls


def test_the_scan_stops_at_a_record_not_whole_yet_and_at_one_to_dispatch(
        log: CommitLog) -> None:
    from common.store.extensions import StoreExtensions

    markers = StoreExtensions().markers
    first = log.put_batch("orders", 0, [b"a" * 100] * 5)
    tagged = log.put(Message("orders", b"t", tags="x"), 0)
    mf = log.queue.find(0)
    assert mf is not None
    runs, pos, count, ts, read = native.scan(mf.buffer, 0, log.max_offset, mf.file_size, 100, 0,
                                             markers, ())
    assert (pos, count, read) == (tagged.phy_offset, 5, None)  # the tagged one starts the next
    size = 91 + 100 + len("orders") + 20  # fixed part, body, topic, the CRC entry
    assert runs == [[b"orders", 0, 0, [(o, size, 0) for o in first.record_offsets]]]
    assert ts == first.store_timestamp
    # a limit inside the third record: two records, and the stop where the third begins
    third = first.record_offsets[2]
    runs, pos, count, _, _ = native.scan(mf.buffer, 0, third + 50, mf.file_size, 100, 0,
                                         markers, ())
    assert (pos, count) == (third, 2)
    runs, pos, count, _, _ = native.scan(mf.buffer, 0, log.max_offset, mf.file_size, 3, 7,
                                         markers, ())
    assert (pos, count, runs[0][3][0][0]) == (third + size, 3, 7)  # max_records; phy from base
    with pytest.raises(TypeError):
        native.scan(mf.buffer, 0, log.max_offset, mf.file_size, 100, 0)  # no markers


def test_a_record_with_properties_is_read_as_python_reads_it(
        log: CommitLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatched record's tags code, keys and properties from C: equal to
    ``dispatch_request``'s, including text that is not UTF-8 (replaced, as Python decodes it)
    and a later property of one name winning."""
    for tags in ("T", "é🙂", None):
        log.put(Message("orders", b"x", tags=tags, keys="k1 k2",
                        properties={PROPERTY_UNIQ_KEY: "id-1", "color": "caf?"}), 1)
    at = log.put(Message("orders", b"y", properties={"color": "caf?", "size": "1"}), 1)
    mf = log.queue.find(0)
    assert mf is not None
    raw = bytes(mf.buffer[at.phy_offset:at.phy_offset + at.wrote_bytes])
    mf.buffer[at.phy_offset + raw.index(b"caf?") + 3] = 0xE9  # not UTF-8 any more
    with_c = dispatch(log, native, monkeypatch)
    python = dispatch(log, None, monkeypatch)
    assert with_c.calls == python.calls
    indexed = [c[1] for c in python.calls if c[0] == "index"]
    assert [r.keys for r in indexed] == [("k1", "k2", "id-1")] * 3
    assert indexed[0].tags_code != 0 and indexed[2].tags_code == 0


def test_the_scan_takes_a_record_to_dispatch_only_first_and_plain_properties_anywhere(
        log: CommitLog) -> None:
    from common.store.extensions import StoreExtensions

    markers = StoreExtensions().markers
    plain = log.put(Message("orders", b"p", properties={"color": "blue"}), 0)
    keyed = log.put(Message("orders", b"k", keys="a"), 0)
    last = log.put(Message("orders", b"q"), 0)
    mf = log.queue.find(0)
    assert mf is not None
    found, pos, count, _, first = native.scan(mf.buffer, 0, log.max_offset, mf.file_size, 100,
                                              0, markers, ())
    assert (pos, count, first) == (keyed.phy_offset, 1, None)  # stops before the keyed one
    found, pos, count, _, first = native.scan(mf.buffer, pos, log.max_offset, mf.file_size,
                                              100, 0, markers, ())
    assert (pos, count) == (log.max_offset, 2)  # the keyed one first, then the plain one
    assert first[2] == ("a",) and first[3] == {"KEYS": "a"}
    assert [e[0] for e in found[0][3]] == [keyed.phy_offset, last.phy_offset]
    # a topic with a tags-code rule: its keyed records are Python's
    found, pos, count, _, first = native.scan(mf.buffer, keyed.phy_offset, log.max_offset,
                                              mf.file_size, 100, 0, markers, (b"orders",))
    assert (pos, count, first) == (keyed.phy_offset, 0, None)
    assert plain.ok
    with pytest.raises(TypeError):
        native.scan(mf.buffer, 0, log.max_offset, mf.file_size, 100, 0, ["x"], ())


def _lengths_at(buf: Any, at: int) -> tuple[int, int, int]:
    """Where the body, topic and properties lengths of the record at ``at`` are."""
    body_len = int.from_bytes(buf[at + 84:at + 88], "big")
    topic_at = at + 88 + body_len
    return at + 84, topic_at, topic_at + 1 + buf[topic_at]


@pytest.mark.parametrize("field, value", [
    ("props", b"\xff\xff"), ("props", b"\x00\x00"), ("topic", b"\xff"),
    ("body", b"\x7f\xff\xff\xff"), ("body", b"\xff\xff\xff\xfb")])
def test_a_length_past_its_record_stops_both_at_the_record_after_the_same_dispatches(
        log: CommitLog, monkeypatch: pytest.MonkeyPatch, field: str, value: bytes) -> None:
    """A record whose body, topic or properties length does not add up to its size (a
    corrupt log) is refused as corrupt by both loops, at its offset, nothing read past it:
    the last record of a segment, whose properties length would reach past the mapping."""
    fill(log, 5)
    records = [phy for phy, _ in log.iter_records(0, log.max_offset)]
    size = 16 * 1024
    victim = next(a for a, b in itertools.pairwise(records) if a // size != b // size)
    mf = log.queue.find(victim)
    assert mf is not None
    at = victim - mf.file_from_offset
    body, topic, props = _lengths_at(mf.buffer, at)
    where = {"body": body, "topic": topic, "props": props}[field]
    mf.buffer[where:where + len(value)] = value
    python = dispatch(log, None, monkeypatch)
    assert ("raised", victim) in python.calls
    with_c = dispatch(log, native, monkeypatch)
    assert with_c.calls == python.calls


def test_the_scan_reads_no_property_past_its_record(log: CommitLog) -> None:
    """A properties length reaching into the bytes after the record: the scan stops at the
    record (Python's to refuse), and never reads what follows as the record's keys."""
    from common.store.extensions import StoreExtensions

    markers = StoreExtensions().markers
    at = log.put(Message("orders", b"x", properties={"color": "blue"}), 0)
    mf = log.queue.find(0)
    assert mf is not None
    raw = bytearray(mf.buffer[at.phy_offset:at.phy_offset + at.wrote_bytes])
    _, _, props = _lengths_at(raw, 0)
    after = b"KEYS\x01stolen\x02"
    buf = raw + after + bytes(64)
    buf[props:props + 2] = (int.from_bytes(raw[props:props + 2], "big")
                            + len(after)).to_bytes(2, "big")
    found, pos, count, _, first = native.scan(bytes(buf), 0, len(raw), len(buf), 100, 0,
                                              markers, ())
    assert (found, pos, count, first) == ([], 0, 0, None)
    buf[props:props + 2] = (0).to_bytes(2, "big")  # too short: the record's bytes left over
    assert native.scan(bytes(buf), 0, len(raw), len(buf), 100, 0, markers, ())[1:3] == (0, 0)
