"""A store directory's CommitLog as seen by a reader: segments, readable end, byte slices.

Nothing here writes. A live broker may be appending while we read, so a reader never goes past
the CommitLog offset the store recorded as flushed (``physicFlushedOffset`` in the
``checkpoint`` file, RocketMQ's ``StoreCheckpoint``); a store directory without a checkpoint
(a copy, a test fixture) is read up to its last whole valid record.
"""

from __future__ import annotations

import dataclasses
import itertools
import mmap
import os
import re
from pathlib import Path

import numpy as np

from common.core.errors import CorruptionError, StoreError
from common.format import record

from .decode import walk

NAME_DIGITS = 20
DEFAULT_MAX_PARTITION_BYTES = 128 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Segment:
    """One CommitLog file: ``path`` holds log offsets ``[base, base + size)``."""

    path: str
    base: int
    size: int

    @property
    def end(self) -> int:
        return self.base + self.size


@dataclasses.dataclass(frozen=True)
class Slice:
    """Bytes ``[lo, hi)`` of a segment file to walk, keeping records whose CommitLog offset is
    in ``[min_offset, max_offset)``. ``lo`` is a record boundary; ``hi`` is one too, or the
    segment's end (the walk then ends at the BLANK padding)."""

    path: str
    base: int
    lo: int
    hi: int
    seg_size: int
    min_offset: int
    max_offset: int


def list_segments(store_dir: str | Path) -> list[Segment]:
    """The CommitLog segments of a store directory, in offset order; StoreError on a gap."""
    log_dir = Path(store_dir) / "commitlog"
    if not log_dir.is_dir():
        raise StoreError(f"{store_dir} is not a store directory (no commitlog/)")
    segments = []
    for entry in log_dir.iterdir():
        if len(entry.name) == NAME_DIGITS and entry.name.isdigit() and entry.is_file():
            size = entry.stat().st_size
            if size > 0:
                segments.append(Segment(str(entry), int(entry.name), size))
    segments.sort(key=lambda s: s.base)
    for prev, cur in itertools.pairwise(segments):
        if cur.base != prev.end:
            raise StoreError(f"gap in {log_dir}: {prev.path} ends at {prev.end}, next starts {cur.base}")
    return segments


def read_bytes(path: str, lo: int, hi: int) -> np.ndarray:
    """Bytes ``[lo, hi)`` of a file as a uint8 array (a private copy)."""
    return np.fromfile(path, dtype=np.uint8, count=hi - lo, offset=lo)


def flushed_offset(store_dir: str | Path) -> int | None:
    """``physicFlushedOffset`` from the store's checkpoint file, or None without one."""
    path = Path(store_dir) / "checkpoint"
    try:
        raw = path.read_bytes()[:32]
    except FileNotFoundError:
        return None
    if len(raw) < 32:
        return None
    return int.from_bytes(raw[24:32], "big", signed=True)


def valid_end(segments: list[Segment]) -> int:
    """Offset just past the last whole valid record (with a correct body CRC)."""
    for seg in reversed(segments):
        buf = read_bytes(seg.path, 0, seg.size)
        found = walk(buf, seg.base)
        if found.starts.size == 0 and found.stop != "blank" and seg is not segments[0]:
            continue  # an allocated segment nothing was written to yet
        if found.stop == "blank":
            return seg.end
        # Only the last record can be half written: check its body.
        starts = found.starts
        if starts.size and not _crc_ok(buf, int(starts[-1])):
            return seg.base + int(starts[-1])
        return seg.base + found.end
    return segments[0].base if segments else 0


def _crc_ok(buf: np.ndarray, pos: int) -> bool:
    return record.check(buf.data, pos, buf.size, verify_crc=True).size > 0


def readable_end(store_dir: str | Path, segments: list[Segment]) -> int:
    """Where a reader must stop: the store's flushed offset, else the valid end."""
    if not segments:
        return 0
    flushed = flushed_offset(store_dir)
    if flushed is None:
        return valid_end(segments)
    return max(segments[0].base, min(flushed, segments[-1].end))


def is_boundary(seg: Segment, phy_offset: int) -> bool:
    """True when a record or the BLANK padding starts exactly at ``phy_offset``."""
    pos = phy_offset - seg.base
    if pos in (0, seg.size):
        return True
    with open(seg.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            return record.check(view, pos, seg.size, phy_offset, verify_crc=False).size >= 0
        finally:
            view.release()


def record_starts(seg: Segment, hi: int) -> np.ndarray:
    """Positions of the records in ``seg`` below ``hi`` (for cutting a segment into slices)."""
    found = walk(read_bytes(seg.path, 0, hi), seg.base)
    return found.starts


def plan(
    segments: list[Segment],
    start: int,
    end: int,
    readable: int,
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
) -> list[Slice]:
    """Slices covering the records with offsets in ``[start, min(end, readable))``, at most
    about ``max_partition_bytes`` each. ``readable`` is a record boundary (readable_end)."""
    end = min(end, readable)
    slices: list[Slice] = []
    for seg in segments:
        if seg.end <= start or seg.base >= end:
            continue
        lo_off = max(start, seg.base)
        lo = lo_off - seg.base if is_boundary(seg, lo_off) else 0
        data_end = seg.size if readable >= seg.end else readable - seg.base
        hi = end - seg.base if end < seg.end and is_boundary(seg, end) else data_end
        if hi <= lo:
            continue
        for cut_lo, cut_hi in _cuts(seg, lo, hi, max_partition_bytes):
            slices.append(Slice(seg.path, seg.base, cut_lo, cut_hi, seg.size, start, end))
    return slices


def _cuts(seg: Segment, lo: int, hi: int, max_bytes: int) -> list[tuple[int, int]]:
    if hi - lo <= max_bytes:
        return [(lo, hi)]
    starts = record_starts(seg, hi)
    starts = starts[starts >= lo]
    targets = np.arange(lo + max_bytes, hi, max_bytes)
    cut_idx = np.unique(np.searchsorted(starts, targets))
    cuts = [int(starts[i]) for i in cut_idx if i < starts.size and starts[i] > lo]
    edges = [lo, *cuts, hi]
    return list(itertools.pairwise(edges))


def check_walk_end(sl: Slice, stop: str, end: int, reason: str) -> None:
    """CorruptionError unless the walk of ``sl`` ended where the slice says it must."""
    length = sl.hi - sl.lo
    if stop == "end" and end == length:
        return
    if stop == "blank" and sl.hi == sl.seg_size:
        return
    why = reason or f"records end at {end} of {length} bytes"
    raise CorruptionError(sl.base + sl.lo + end, f"{os.path.basename(sl.path)}: {why}")


# ---- several broker groups -------------------------------------------------------------------
_GROUP_NAME = re.compile(r"^[A-Za-z0-9_.%|-]{1,127}\Z")


def parse_stores(text: str) -> list[tuple[str, str]]:
    """``"a=/path/a,b=/path/b"`` -> [(broker group, store directory)] (ValueError naming the
    item that is not ``name=path``, or a group named twice)."""
    out: list[tuple[str, str]] = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, sep, path = item.partition("=")
        if not sep or not _GROUP_NAME.match(name.strip()) or not path.strip():
            raise ValueError(f"{item!r} is not broker-group=store-directory")
        out.append((name.strip(), path.strip()))
    if not out:
        raise ValueError("no store given: name=path[,name=path...]")
    names = [n for n, _ in out]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"broker group {name} named twice")
    return out


def looks_like_stores(text: str) -> bool:
    """A ``path`` option holding ``name=path,...`` rather than one directory: it has an ``=``
    and is no directory (``parse_stores`` then says what is wrong with it, if anything)."""
    return "=" in text and not Path(text).is_dir()


def cluster_replicas(directory: str | Path) -> dict[str, list[str]]:
    """Broker group -> its replicas' store directories, found under ``directory`` (what
    ``replog cluster up`` makes: one ``broker.yaml`` per broker, naming its ``brokerName``
    and ``storePathRootDir``). A broker whose store holds no CommitLog is left out."""
    import yaml

    found: dict[str, list[str]] = {}
    root = Path(directory)
    configs = sorted(root.glob("*/broker.yaml"))
    if not configs:
        raise ValueError(f"{directory}: no */broker.yaml (not a `replog cluster up` directory)")
    for cfg in configs:
        try:
            doc = yaml.safe_load(cfg.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ValueError(f"{cfg}: {e}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{cfg}: not a broker configuration")  # noqa: TRY004 - a bad file
        name = str(doc.get("brokerName", "broker-a"))
        store = Path(str(doc.get("storePathRootDir", cfg.parent / "store"))).expanduser()
        if not store.is_absolute():
            store = cfg.parent / store
        if (store / "commitlog").is_dir():
            found.setdefault(name, []).append(str(store))
    if not found:
        raise ValueError(f"{directory}: no broker there has a store yet")
    return found


def most_complete(stores: list[str]) -> str:
    """The replica holding the most of the log (its readable end; ties: the first): the one
    to read a group from."""
    best, best_end = stores[0], -1
    for store in stores:
        try:
            segments = list_segments(store)
        except StoreError:
            continue
        end = readable_end(store, segments)
        if end > best_end:
            best, best_end = store, end
    return best
