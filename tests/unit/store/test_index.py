"""IndexFile / IndexService against an independent reader of RocketMQ's index layout.

``parse_index`` reads a file with plain ``struct``: 40-byte header (q q q q i i), ``slots`` ints,
then 20-byte entries (i q i i) at 40 + 4*slots + 20*n; ``chain`` walks a slot's list. Hashes in
the tests come from ``java_hashcode`` below, written here from the Java definition.
"""

from __future__ import annotations

import re
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.core.errors import StoreError
from common.core.message import PROPERTY_KEYS, PROPERTY_UNIQ_KEY, java_hash
from common.store.index import IndexService, index_hash, index_keys, string_hash
from common.store.index import key_hash as svc_key_hash

pytestmark = pytest.mark.unit

SLOTS = 8
T0 = 1_700_000_000_000


# ---- independent reader ------------------------------------------------------------------------
def java_hashcode(text: str) -> int:
    """Java String.hashCode over UTF-16 code units, 32-bit signed."""
    h = 0
    data = text.encode("utf-16-be")
    for (unit,) in struct.iter_unpack(">H", data):
        h = (h * 31 + unit) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


def key_hash(topic: str, key: str) -> int:
    h = java_hashcode(f"{topic}#{key}")
    return 0 if h == -(1 << 31) else abs(h)


@dataclass
class Parsed:
    begin_ts: int
    end_ts: int
    begin_phy: int
    end_phy: int
    slot_count: int
    index_count: int
    slots: tuple[int, ...]
    entries: list[tuple[int, int, int, int]]  # index n -> (hash, phy, time diff, prev)


def parse_index(path: Path, slots: int, max_index: int) -> Parsed:
    data = path.read_bytes()
    assert len(data) == 40 + 4 * slots + 20 * max_index
    header = struct.unpack_from(">qqqqii", data, 0)
    slot_table = struct.unpack_from(f">{slots}i", data, 40)
    base = 40 + 4 * slots
    entries = [struct.unpack_from(">iqii", data, base + 20 * n) for n in range(max_index)]
    return Parsed(*header, slot_table, entries)


def chain(p: Parsed, h: int) -> list[int]:
    """Offsets of entries with hash ``h``, newest first, walking the slot's chain."""
    out = []
    n = p.slots[h % len(p.slots)]
    while 0 < n < p.index_count:
        eh, phy, _, prev = p.entries[n]
        if eh == h:
            out.append(phy)
        n = prev
    return out


def index_files(root: Path) -> list[Path]:
    return sorted((root / "index").iterdir())


# ---- fixtures ----------------------------------------------------------------------------------------
@pytest.fixture
def svc(tmp_path: Path) -> Iterator[IndexService]:
    s = IndexService(tmp_path, SLOTS, 64)
    s.load(True, 0)
    yield s
    s.shutdown()


def small(tmp_path: Path, max_index: int = 5) -> IndexService:
    s = IndexService(tmp_path, SLOTS, max_index)
    s.load(True, 0)
    return s


# ---- hashing and keys --------------------------------------------------------------------------------
def test_hash_known_java_values() -> None:
    assert string_hash("hello") == 99162322 == java_hashcode("hello")
    assert string_hash("") == 0
    assert string_hash("Aa") == string_hash("BB") == 2112
    assert string_hash("polygenelubricants") == -(1 << 31)
    assert index_hash("polygenelubricants") == 0  # Math.abs(MIN_VALUE) is negative -> 0


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80) | st.text(alphabet=st.characters(min_codepoint=0x10000), max_size=5))
def test_fast_hash_equals_java(text: str) -> None:
    assert string_hash(text) == java_hashcode(text) == java_hash(text)


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=20), st.text(max_size=1100))
def test_prefix_key_hash_equals_whole_string_hash(topic: str, key: str) -> None:
    assert svc_key_hash(topic, key) == key_hash(topic, key)


def test_min_value_hash_of_topic_key_maps_to_zero() -> None:
    """Build a key whose "T#key" hashes to Integer.MIN_VALUE: base-31 digits as chars."""
    target = ((1 << 31) - (java_hashcode("T#") % (1 << 32)) * 31**7) % (1 << 32)
    digits = [(target // 31**i) % 31 for i in reversed(range(7))]
    key = "".join(chr(d) for d in digits)
    assert java_hashcode(f"T#{key}") == -(1 << 31)
    assert svc_key_hash("T", key) == index_hash(f"T#{key}") == 0


def test_index_keys_uniq_then_keys() -> None:
    props = {PROPERTY_UNIQ_KEY: "U1", PROPERTY_KEYS: "k1  k2 k3", "TAGS": "t"}
    assert index_keys(props) == ["U1", "k1", "k2", "k3"]
    assert index_keys({}) == []


# ---- layout --------------------------------------------------------------------------------------------
def test_layout_matches_independent_reader(svc: IndexService, tmp_path: Path) -> None:
    puts = [(["k1", "k2"], 100, T0), (["k3"], 300, T0 + 2500), (["k1"], 500, T0 + 9999)]
    for keys, phy, ts in puts:
        assert svc.build("T", keys, phy, ts) == len(keys)
    svc.flush()
    [path] = index_files(tmp_path)
    assert re.fullmatch(r"\d{17}", path.name)
    p = parse_index(path, SLOTS, 64)
    assert (p.begin_ts, p.end_ts, p.begin_phy, p.end_phy) == (T0, T0 + 9999, 100, 500)
    assert p.index_count == 5
    assert p.entries[0] == (0, 0, 0, 0)  # index number 0 is never used
    hashes = [key_hash("T", k) for k in ("k1", "k2", "k3", "k1")]
    assert [e[0] for e in p.entries[1:5]] == hashes
    assert [e[1] for e in p.entries[1:5]] == [100, 100, 300, 500]
    assert [e[2] for e in p.entries[1:5]] == [0, 0, 2, 9]
    heads: dict[int, int] = {}
    prevs = []
    for n, h in enumerate(hashes, start=1):
        prevs.append(heads.get(h % SLOTS, 0))
        heads[h % SLOTS] = n
    assert [e[3] for e in p.entries[1:5]] == prevs
    assert p.slots == tuple(heads.get(i, 0) for i in range(SLOTS))
    assert p.slot_count == len(heads)
    assert chain(p, hashes[0]) == [500, 100]


def test_query_newest_first_window_and_max(svc: IndexService) -> None:
    for i in range(10):
        svc.build("T", ["k"], 100 * i, T0 + 1000 * i)
    svc.build("U", ["k"], 2000, T0 + 20_000)  # same key, other topic
    assert svc.query("T", "k", 64, 0, 2**62) == [100 * i for i in reversed(range(10))]
    assert svc.query("T", "k", 3, 0, 2**62) == [900, 800, 700]
    assert svc.query("T", "k", 64, T0 + 3000, T0 + 5000) == [500, 400, 300]
    assert svc.query("T", "nope", 64, 0, 2**62) == []


def test_find_reads_past_any_number_of_hits_it_refuses(tmp_path: Path) -> None:
    """A broker's own look-up (a delivery mark, a commit) must find its record behind any
    number of a client's newer entries on the same hash, across files: ``"`@"`` and ``"__"``
    share String.hashCode, so a key the client may write collides with the broker's."""
    svc = small(tmp_path)
    try:
        assert index_hash("T#__TIMER_SRC12") == index_hash("T#`@TIMER_SRC12")
        svc.build("T", ["__TIMER_SRC12"], 100, T0)
        for i in range(1, 21):
            svc.build("T", ["`@TIMER_SRC12"], 100 + i, T0 + 1000 * i)
        assert len(svc.files) > 2 and 100 not in svc.query("T", "__TIMER_SRC12", 16, 0, 2**62)
        assert svc.find("T", "__TIMER_SRC12", lambda at: at == 100) == 100
        assert svc.find("T", "__TIMER_SRC12", lambda at: at == 105) == 105
        assert svc.find("T", "__TIMER_SRC12", lambda at: False) is None
        assert svc.find("T", "__TIMER_SRC12", lambda at: at == 100, T0 + 5000) is None
    finally:
        svc.shutdown()


def test_hash_collisions_are_returned_for_the_caller(svc: IndexService) -> None:
    # "Aa" and "BB" share String.hashCode, so "T#Aa" and "T#BB" do too.
    assert index_hash("T#Aa") == index_hash("T#BB")
    svc.build("T", ["Aa"], 100, T0)
    svc.build("T", ["BB"], 200, T0)
    svc.build("T", ["zz"], 300, T0)
    assert svc.query("T", "Aa", 64, 0, 2**62) == [200, 100]
    assert svc.query("T", "zz", 64, 0, 2**62) == [300]


def test_slot_collisions_filtered_by_hash(svc: IndexService, tmp_path: Path) -> None:
    keys = [f"key{i}" for i in range(40)]  # 40 keys over 8 slots: long chains
    for i, k in enumerate(keys):
        svc.build("T", [k], 10 * i, T0)
    svc.flush()
    p = parse_index(index_files(tmp_path)[0], SLOTS, 64)
    for i, k in enumerate(keys):
        expected = chain(p, key_hash("T", k))
        assert svc.query("T", k, 64, 0, 2**62) == expected
        assert 10 * i in expected


# ---- rolling ----------------------------------------------------------------------------------------------
def test_file_rolls_at_n_minus_one_keys(tmp_path: Path) -> None:
    s = small(tmp_path, max_index=5)  # 4 keys per file
    try:
        for i in range(9):
            s.build("T", [f"k{i}"], 100 * i, T0 + 1000 * i)
        s.flush()
        paths = index_files(tmp_path)
        assert len(paths) == 3 and [p.name for p in paths] == sorted(p.name for p in paths)
        parsed = [parse_index(p, SLOTS, 5) for p in paths]
        assert [p.index_count for p in parsed] == [5, 5, 2]
        assert [p.end_phy for p in parsed] == [300, 700, 800]
        assert [p.begin_phy for p in parsed] == [0, 400, 800]
        for i in range(9):
            assert s.query("T", f"k{i}", 64, 0, 2**62) == [100 * i]
        assert s.flushed_end_timestamp == T0 + 7000  # newest *full* file flushed
    finally:
        s.shutdown()


def test_new_file_header_seeded_from_previous(tmp_path: Path) -> None:
    s = small(tmp_path, max_index=3)  # 2 keys per file
    try:
        s.build("T", ["a", "b"], 100, T0)
        s.build("T", ["c"], 200, T0 + 5000)  # does not fit: a new file is made for it
        s.build("T", ["d"], 300, T0 + 6000)
        assert s.build("T", ["d"], 300, T0 + 6000) == 0  # re-dispatch: rolls, adds nothing
        s.flush()
        first, second, third = (parse_index(p, SLOTS, 3) for p in index_files(tmp_path))
        assert (first.begin_phy, first.end_phy, first.end_ts) == (100, 100, T0)
        assert (second.begin_phy, second.end_phy) == (200, 300)
        assert (second.begin_ts, second.end_ts) == (T0 + 5000, T0 + 6000)
        assert second.entries[1][2] == 0 and second.entries[2][2] == 1
        assert (third.begin_phy, third.end_phy, third.begin_ts, third.end_ts) == (
            300, 300, T0 + 6000, T0 + 6000)
        assert (third.index_count, third.slot_count, any(third.slots)) == (1, 0, False)
    finally:
        s.shutdown()


def test_names_unique_within_one_millisecond(tmp_path: Path) -> None:
    s = small(tmp_path, max_index=2)  # 1 key per file: a roll per message
    try:
        for i in range(20):
            s.build("T", ["k"], i, T0)
        names = [p.name for p in index_files(tmp_path)]
        assert len(names) == 20 and names == sorted(set(names))
        assert s.query("T", "k", 64, 0, 2**62) == list(reversed(range(20)))
    finally:
        s.shutdown()


# ---- idempotent re-dispatch -------------------------------------------------------------------------
def test_redispatch_adds_nothing(svc: IndexService, tmp_path: Path) -> None:
    for i in range(5):
        svc.build("T", ["k", f"u{i}"], 100 * i, T0 + i)
    svc.flush()
    before = index_files(tmp_path)[0].read_bytes()
    for i in range(5):
        assert svc.build("T", ["k", f"u{i}"], 100 * i, T0 + i) == 0
    svc.flush()
    assert index_files(tmp_path)[0].read_bytes() == before
    assert svc.query("T", "k", 64, 0, 2**62) == [400, 300, 200, 100, 0]


def test_redispatch_of_half_built_message_adds_missing_keys(svc: IndexService) -> None:
    svc.build("T", ["a"], 100, T0)  # crash after the first of two keys
    assert svc.build("T", ["a", "b", "b"], 100, T0) == 1
    assert svc.query("T", "a", 64, 0, 2**62) == [100]
    assert svc.query("T", "b", 64, 0, 2**62) == [100]


def test_redispatch_across_a_roll(tmp_path: Path) -> None:
    s = small(tmp_path, max_index=3)  # 2 keys per file
    try:
        assert s.build("T", ["a", "b", "c"], 100, T0) == 3  # a, b | c
        assert s.build("T", ["a", "b", "c"], 100, T0) == 0
        for k in "abc":
            assert s.query("T", k, 64, 0, 2**62) == [100]
    finally:
        s.shutdown()


# ---- load after a crash ----------------------------------------------------------------------------
def test_abnormal_exit_drops_files_newer_than_checkpoint(tmp_path: Path) -> None:
    s = small(tmp_path, max_index=3)
    for i in range(5):  # files: [0,1] [2,3] [4]
        s.build("T", [f"k{i}"], 100 * i, T0 + 1000 * i)
    checkpoint = s.flush()
    assert checkpoint == T0 + 3000
    s.shutdown()
    names = [p.name for p in index_files(tmp_path)]

    normal = IndexService(tmp_path, SLOTS, 3)
    normal.load(True, checkpoint)
    assert len(normal.files) == 3
    normal.shutdown()

    crashed = IndexService(tmp_path, SLOTS, 3)
    try:
        crashed.load(False, checkpoint)
        assert [p.name for p in index_files(tmp_path)] == names[:2]
        assert crashed.flushed_end_timestamp == checkpoint
        assert crashed.query("T", "k4", 64, 0, 2**62) == []
        assert crashed.build("T", ["k3"], 300, T0 + 3000) == 0  # below endPhyOffset: skipped
        assert crashed.build("T", ["k4"], 400, T0 + 4000) == 1  # rebuilt by re-dispatch
        assert crashed.query("T", "k4", 64, 0, 2**62) == [400]
        assert parse_index(index_files(tmp_path)[-1], SLOTS, 3).begin_phy == 400
    finally:
        crashed.shutdown()


def test_load_refuses_garbage_and_wrong_size(tmp_path: Path) -> None:
    (tmp_path / "index").mkdir()
    bad = tmp_path / "index" / "notatime"
    bad.write_bytes(b"")
    s = IndexService(tmp_path, SLOTS, 5)
    with pytest.raises(StoreError, match=re.escape(str(bad))):
        s.load(True, 0)
    bad.unlink()
    (tmp_path / "index" / "20240101000000000").write_bytes(b"\0" * 10)
    with pytest.raises(StoreError, match="maxHashSlotNum/maxIndexNum"):
        s.load(True, 0)


@pytest.mark.parametrize(
    ("at", "raw", "problem"),
    [
        (0, b"\xff" * 40, "indexCount -1 is negative"),
        (24, (0x7FFFFFFFFFFFFF00).to_bytes(8, "big"), "but its last entry is at 300"),
        (32, (7).to_bytes(4, "big"), "hashSlotCount 7 for 4 keys"),
        (16, (10**6).to_bytes(8, "big"), "beginPhyOffset 1000000 > endPhyOffset 300"),
    ],
)
def test_a_damaged_header_is_refused_after_a_clean_stop_and_dropped_after_a_crash(
    tmp_path: Path, at: int, raw: bytes, problem: str
) -> None:
    """An audit found these were trusted: old keys vanished, or new ones were never indexed."""
    s = small(tmp_path, max_index=64)
    for i in range(4):
        s.build("T", [f"k{i}"], 100 * i, T0 + i)
    s.shutdown()
    (path,) = index_files(tmp_path)
    data = bytearray(path.read_bytes())
    data[at : at + len(raw)] = raw
    path.write_bytes(bytes(data))
    again = IndexService(tmp_path, SLOTS, 64)
    with pytest.raises(StoreError, match=re.escape(problem)):
        again.load(True, 0)
    assert path.read_bytes() == bytes(data)  # nothing changed
    crashed = IndexService(tmp_path, SLOTS, 64)
    crashed.load(False, T0 + 10)  # after a crash the file is dropped: reput indexes again
    try:
        assert crashed.files == [] and not path.exists()
    finally:
        crashed.shutdown()


# ---- deletion and truncation -------------------------------------------------------------------------
def test_delete_expired_never_the_last(tmp_path: Path) -> None:
    s = small(tmp_path, max_index=3)
    try:
        for i in range(6):  # [0,1] [2,3] [4,5]
            s.build("T", [f"k{i}"], 100 * i, T0 + i)
        names = [p.name for p in index_files(tmp_path)]
        assert s.delete_expired(100) == 0  # first file's endPhyOffset 100 is not below
        assert s.delete_expired(101) == 1
        assert [p.name for p in index_files(tmp_path)] == names[1:]
        assert s.query("T", "k0", 64, 0, 2**62) == []
        assert s.delete_expired(10**9) == 1
        assert [p.name for p in index_files(tmp_path)] == names[2:]
        assert s.query("T", "k5", 64, 0, 2**62) == [500]
    finally:
        s.shutdown()


def _build_series(s: IndexService, count: int) -> None:
    for i in range(count):
        s.build("T", [f"k{i % 7}", f"u{i}"], 100 * i, T0 + 1000 * i)


def test_truncate_undoes_entries_exactly(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    full = IndexService(a, SLOTS, 64)
    prefix = IndexService(b, SLOTS, 64)
    try:
        full.load(True, 0)
        prefix.load(True, 0)
        _build_series(full, 20)
        _build_series(prefix, 12)
        full.truncate(1150)  # cut inside message 11: messages 12.. go
        assert full.query("T", "u12", 64, 0, 2**62) == []
        assert full.query("T", "k0", 64, 0, 2**62) == [700, 0]
        [pa], [pb] = index_files(a), index_files(b)
        ra, rb = parse_index(pa, SLOTS, 64), parse_index(pb, SLOTS, 64)
        assert ra.slots == rb.slots and ra.entries == rb.entries  # zeroed and relinked on disk
        assert (ra.index_count, ra.slot_count, ra.end_phy) == (rb.index_count, rb.slot_count, 1100)
        full.build("T", ["k5"], 1150, T0 + 12_000)  # re-dispatch after the cut works
        assert full.query("T", "k5", 64, 0, 2**62) == [1150, 500]
    finally:
        full.shutdown()
        prefix.shutdown()


def test_truncate_deletes_files_beginning_after(tmp_path: Path) -> None:
    s = small(tmp_path, max_index=3)
    try:
        for i in range(6):  # [0,1] [2,3] [4,5]
            s.build("T", [f"k{i}"], 100 * i, T0 + 1000 * i)
        s.flush()
        s.truncate(300)
        paths = index_files(tmp_path)
        assert len(paths) == 2
        assert parse_index(paths[1], SLOTS, 3).index_count == 2  # k2 stays, k3 undone
        assert s.query("T", "k2", 64, 0, 2**62) == [200]
        assert [s.query("T", f"k{i}", 64, 0, 2**62) for i in (3, 4, 5)] == [[], [], []]
        assert s.flushed_end_timestamp == T0 + 1000  # the undone file is no longer full
    finally:
        s.shutdown()


def test_destroy(svc: IndexService, tmp_path: Path) -> None:
    svc.build("T", ["k"], 0, T0)
    svc.destroy()
    assert not (tmp_path / "index").exists()
    assert svc.query("T", "k", 64, 0, 2**62) == []


def test_queries_race_builds_and_rolls(tmp_path: Path) -> None:
    """Queries from another thread return only offsets of the key while files roll and expire."""
    s = small(tmp_path, max_index=33)
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                for k in range(5):
                    for phy in s.query("T", f"k{k}", 64, 0, 2**62):
                        assert phy % 500 == 100 * k
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(3000):
            s.build("T", [f"k{i % 5}"], 100 * i, T0 + i)
            if i % 200 == 199:
                s.delete_expired(100 * (i - 100))
    finally:
        done.set()
        t.join(timeout=10)
        s.shutdown()
    assert not t.is_alive() and errors == []


def test_a_new_file_appears_only_at_its_full_size(tmp_path: Path) -> None:
    """An index file is made under a hidden name and renamed once sized; load removes what a
    crash between the two left, and keeps the files around it."""
    s = small(tmp_path, max_index=3)
    s.build("T", ["k0"], 0, T0)
    s.shutdown()
    directory = index_files(tmp_path)[0].parent
    leftover = directory / ".20260101000000000.new"
    leftover.write_bytes(b"")  # a crash right after creating it
    again = IndexService(tmp_path, SLOTS, 3)
    try:
        again.load(True, T0)
        assert not leftover.exists()
        assert again.query("T", "k0", 8, 0, 2**62) == [0]
    finally:
        again.shutdown()
