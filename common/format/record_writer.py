"""Writing a put's records into a segment's mapping: in C when the extension is built, else here.

    write_items(buf, pos, items, *shared) -> (entries, plain, cq)
        items: (size, crc, flag, body, tail, reconsume, sys_flag) per record, as
        ``CommitLog._prepare`` makes them; ``tail`` is the topic and properties part, ending
        with the CRC placeholder when ``crc_len`` is 20. ``plain``: every tail is
        ``plain_tail_len`` long (no record carries properties of its own).
    write_bodies(buf, pos, bodies, tail, *shared) -> (entries, cq)
        one record per body, flag, reconsume count and system flag 0, all with ``tail``.

    shared: base, queue_id, queue_offset, born, born_ip, born_port, ts, store_ip, store_port,
            crc_len (then plain_tail_len, for write_items)

Records go at ``buf[pos:]``, their queue offsets counting from ``queue_offset`` and their
physical offsets from ``base + pos``; ``entries`` is (physical offset, size, 0) per record and
``cq`` the same as ConsumeQueue entries, 20 bytes each (``>qiq``), for reput to append as they
are.
Both check everything before the first byte is written.

Why C: a record is a header pack, a body CRC, the whole-record CRC over three pieces and its
ten digits, a few Python operations each. ``write_bodies`` of 64 x 128 B in a tight loop takes
1.30-1.79 us a record here in Python against 0.38-0.39 us in C, and the broker's CPU per
``send_batch`` message fell by a quarter to two fifths (docs/benchmarks.md, "two loops in C,
one wait in recv"). ``_record_writer.c`` is built by ``pip install``
where a C compiler, the Python headers and zlib's are found; without them the build skips it
and this module's Python writer runs, the same bytes (tests/unit/format/test_record_writer.py holds
the two to each other). ``PURE_PYTHON_REPLOG=1`` selects the Python writer anyway
(``common/core/accel.py``).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from itertools import chain
from typing import Any

from common.core import accel
from common.format.record import HEADER, MAGIC_V1, PROP_CRC_LEN, PROP_CRC_PREFIX

Entries = list[tuple[int, int, int]]


def py_write_items(buf: Any, pos: int, items: list[tuple], base: int, queue_id: int,
                   queue_offset: int, born: int, born_ip: bytes, born_port: int, ts: int,
                   store_ip: bytes, store_port: int, crc_len: int,
                   plain_tail_len: int) -> tuple[Entries, bool, bytes]:
    """The Python writer (the reference for the C one). Nothing is written before the last
    line: a refusal on the way leaves ``buf`` as it was."""
    _check_shared(born_ip, store_ip, crc_len)
    pack = HEADER.pack
    crc32 = zlib.crc32
    parts: list[bytes] = []
    add_parts = parts.extend
    entries: Entries = []
    phy = first = base + pos
    plain = True
    last_tail = front = b""
    for item in items:
        size, crc, flag, body, tail, reconsume, sys_flag = item[:7]
        prepared = item[7] if len(item) == 8 else 0  # a commit: its half message's offset
        if type(body) is not bytes or type(tail) is not bytes:
            raise TypeError("an item's body and tail must be bytes")
        if len(tail) < crc_len or size != HEADER.size + len(body) + len(tail):
            raise ValueError("an item's size does not match its pieces")
        head = pack(size, MAGIC_V1, crc, queue_id, flag, queue_offset, phy, sys_flag, born,
                    born_ip, born_port, ts, store_ip, store_port, reconsume, prepared,
                    len(body))
        if crc_len:  # the CRC runs over the pieces; the join below is the one copy
            if tail is not last_tail:  # a batch's plain records share one tail
                last_tail, front = tail, tail[:-crc_len]
            whole = crc32(front, crc32(body, crc32(head))) & 0x7FFFFFFF
            # record.crc_entry(whole), inline: 10 digits, least significant first
            add_parts((head, body, front, PROP_CRC_PREFIX, (b"%010d" % whole)[::-1], b"\x02"))
        else:
            add_parts((head, body, tail))
        entries.append((phy, size, 0))
        plain = plain and len(tail) == plain_tail_len
        phy += size
        queue_offset += 1
    _check_room(buf, pos, phy - first)
    buf[pos : pos + phy - first] = b"".join(parts)
    return entries, plain, _cq_entries(entries)


def py_write_bodies(buf: Any, pos: int, bodies: list[bytes], tail: bytes, base: int,
                    queue_id: int, queue_offset: int, born: int, born_ip: bytes, born_port: int,
                    ts: int, store_ip: bytes, store_port: int, crc_len: int) -> tuple[Entries, bytes]:
    """The Python writer of plain records (the reference for the C one)."""
    _check_shared(born_ip, store_ip, crc_len)
    if type(tail) is not bytes:
        raise TypeError("bodies and tail must be bytes")
    if len(tail) < crc_len:
        raise ValueError("the tail is shorter than the CRC entry")
    pack = HEADER.pack
    crc32 = zlib.crc32
    parts: list[bytes] = []
    add_parts = parts.extend
    entries: Entries = []
    phy = first = base + pos
    fixed = HEADER.size + len(tail)
    front = tail[:-crc_len] if crc_len else tail
    for body in bodies:
        if type(body) is not bytes:
            raise TypeError("bodies and tail must be bytes")
        size = fixed + len(body)
        head = pack(size, MAGIC_V1, crc32(body) & 0x7FFFFFFF, queue_id, 0, queue_offset, phy, 0,
                    born, born_ip, born_port, ts, store_ip, store_port, 0, 0, len(body))
        if crc_len:
            whole = crc32(front, crc32(body, crc32(head))) & 0x7FFFFFFF
            add_parts((head, body, front, PROP_CRC_PREFIX, (b"%010d" % whole)[::-1], b"\x02"))
        else:
            add_parts((head, body, tail))
        entries.append((phy, size, 0))
        phy += size
        queue_offset += 1
    _check_room(buf, pos, phy - first)
    buf[pos : pos + phy - first] = b"".join(parts)
    return entries, _cq_entries(entries)


def _cq_entries(entries: Entries) -> bytes:
    return struct.pack(f">{'qiq' * len(entries)}", *chain.from_iterable(entries))


def _check_shared(born_ip: bytes, store_ip: bytes, crc_len: int) -> None:
    if crc_len not in (0, PROP_CRC_LEN):
        raise ValueError(f"crc_len must be 0 or {PROP_CRC_LEN}")
    if type(born_ip) is not bytes or len(born_ip) != 4 or type(store_ip) is not bytes \
            or len(store_ip) != 4:
        raise ValueError("a host address must be 4 bytes (IPv4)")


def _check_room(buf: Any, pos: int, total: int) -> None:
    if not 0 <= pos <= len(buf) or total > len(buf) - pos:
        raise ValueError("the records do not fit in the buffer")


_native = accel.load("common.format._record_writer")
NATIVE = _native is not None
write_items: Callable[..., tuple[Entries, bool, bytes]] = (
    _native.write_items if _native is not None else py_write_items)
write_bodies: Callable[..., tuple[Entries, bytes]] = (
    _native.write_bodies if _native is not None else py_write_bodies)
