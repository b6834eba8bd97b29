"""``take_digest_run``'s merge in C against the Python loop: the same run, the same digests left.

``CommitLog.take_digest_run`` merges the digests of consecutive plain writes to one queue
(``merge_run`` in ``common/store/_reput_scan.c`` where built, ``merge_run_py`` otherwise). Each
case here builds one deque of WriteDigests, with every way a run can end, and hands a copy to
each version.
"""

from __future__ import annotations

import collections
import random
import struct

import pytest

from common.store.commit_log import WriteDigest, merge_run_py

pytestmark = pytest.mark.unit

native = pytest.importorskip("common.store._reput_scan",
                             reason="the C reput scan is not built here")


def digest(start: int, size: int, topic: str, queue_id: int, first: int, count: int, ts: int,
           with_cq: bool = True) -> WriteDigest:
    entries = [(start + i * size, size, 0) for i in range(count)]
    cq = b"".join(struct.pack(">qiq", *e) for e in entries) if with_cq else b""
    return WriteDigest(start, start + size * count, topic, queue_id, first, entries, ts, cq)


def writes(rnd: random.Random, n: int) -> list[WriteDigest]:
    """Writes in log order, mostly continuing each other; now and then one that ends a run."""
    out: list[WriteDigest] = []
    pos, topic, queue_id, offsets = 0, "orders", 0, {("orders", 0): 0}
    for i in range(n):
        kind = rnd.random()
        if kind < 0.06:
            topic = rnd.choice(["orders", "payments-eu"])
        elif kind < 0.12:
            queue_id = rnd.randrange(3)
        elif kind < 0.15:
            pos += 4096  # a gap: a BLANK, or a write with properties (no digest)
        elif kind < 0.18:
            offsets[(topic, queue_id)] = offsets.get((topic, queue_id), 0) + 1  # skipped offset
        size, count = rnd.randrange(90, 400), rnd.choice([1, 1, 1, 2, 5])
        first = offsets.get((topic, queue_id), 0)
        out.append(digest(pos, size, topic, queue_id, first, count, 1000 + i,
                          with_cq=rnd.random() > 0.05))
        offsets[(topic, queue_id)] = first + count
        pos += size * count
    return out


def both(items: list[WriteDigest], end: int, most: int) -> int:
    """Take runs from two copies until empty, one with each version: equal at every step.
    Returns how many runs merged more than one write."""
    c_left, py_left = collections.deque(items), collections.deque(items)
    runs = 0
    while py_left:
        first_c, first_py = c_left.popleft(), py_left.popleft()
        if first_py.end > end:
            break
        got = native.merge_run(c_left, first_c, end, most)
        want = merge_run_py(py_left, first_py, end, most)
        assert got == want
        assert list(c_left) == list(py_left)
        runs += got is not None
    return runs


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_c_merge_takes_what_the_python_loop_takes(seed: int) -> None:
    rnd = random.Random(seed)
    items = writes(rnd, 600)
    log_end = items[-1].end
    assert both(items, log_end, 4096) > 20  # everything written is dispatchable
    assert both(items, items[len(items) // 2].end, 4096) > 10  # an end inside the deque
    assert both(items, log_end, 7) > 20  # runs cut by max_records
    assert both(items, log_end, 1) == 0  # a first write alone is a whole run already


def test_a_merged_run_joins_the_queue_bytes_only_when_every_write_had_them() -> None:
    whole = [digest(i * 100, 100, "t", 0, i, 1, i) for i in range(4)]
    got = native.merge_run(collections.deque(whole[1:]), whole[0], 400, 4096)
    assert got is not None
    entries, cq, end, count, ts = got
    assert (end, count, ts) == (400, 4, 3)
    assert entries == [(i * 100, 100, 0) for i in range(4)]
    assert cq == b"".join(d.cq for d in whole)
    holed = whole[:2] + [whole[2]._replace(cq=b"")] + whole[3:]
    got = native.merge_run(collections.deque(holed[1:]), holed[0], 400, 4096)
    assert got is not None and got[1] == b""
    assert got == merge_run_py(collections.deque(holed[1:]), holed[0], 400, 4096)


def test_nothing_to_merge_leaves_the_deque_alone() -> None:
    first = digest(0, 100, "t", 0, 0, 1, 1)
    other_queue = digest(100, 100, "t", 1, 0, 1, 2)
    left = collections.deque([other_queue])
    assert native.merge_run(left, first, 10_000, 4096) is None
    assert list(left) == [other_queue]
    assert native.merge_run(collections.deque(), first, 10_000, 4096) is None


def test_a_deque_holding_something_else_is_refused_and_kept() -> None:
    first = digest(0, 100, "t", 0, 0, 1, 1)
    left = collections.deque([("not", "a", "digest")])
    with pytest.raises(TypeError, match="not a WriteDigest"):
        native.merge_run(left, first, 10_000, 4096)
    assert len(left) == 1
    with pytest.raises(TypeError):
        native.merge_run(collections.deque(), ("short",), 10_000, 4096)
