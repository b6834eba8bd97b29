"""``spark.read.format("replog").load(STORE_DIR)``: a store's CommitLog as a DataFrame; over a
cluster of broker groups, one store per group (``load("a=/path/a,b=/path/b")``).

Options (all optional; one of path, stores, clusterDir is needed):

| option              | meaning                                                            |
|---------------------|--------------------------------------------------------------------|
| path                | the store directory (``load(path)`` sets it), or ``name=dir,...``   |
|                     | (as ``stores``)                                                    |
| stores              | ``broker-a=/path/a,broker-b=/path/b``: one store per broker group  |
| clusterDir          | a ``replog cluster up`` directory: every group's most complete     |
|                     | replica (its ``broker.yaml`` files name group and store)           |
| brokerName          | the ``brokerName`` column of a single ``path`` (default empty)     |
| topics              | comma-separated topics to keep                                     |
| startOffset         | first CommitLog offset to read (records starting at or after it)   |
| endOffset           | CommitLog offset to stop at (records starting before it)           |
| verifyCrc           | ``true``: check every body CRC, fail the task on a mismatch        |
| maxPartitionBytes   | split segments larger than this at record boundaries (128 MiB)     |
| batchRows           | records per Arrow batch handed to Spark (65536)                    |
| pushFilters         | push filters into the reader; needs Spark's conf                   |
|                     | ``spark.sql.python.filterPushdown.enabled``. Default: on after     |
|                     | ``common.pipeline.register(spark)`` (which sets it), else off      |

One input partition per CommitLog segment (or per ``maxPartitionBytes`` of it) of each
group's store; each row's ``brokerName`` is its store's group. Pushed-down filters: ``topic``,
``queueId`` and ``brokerName`` equality/IN, and comparisons on ``commitLogOffset`` (applied to
each group's log: offsets are per group); a topic filter skips every column of the records it
drops, a ``brokerName`` filter every store of the other groups. A user schema naming a subset of the
columns (see ``schema.py``) decodes only those. The read stops at the store's flushed offset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from .decode import Records, decode, walk
from .layout import (
    DEFAULT_MAX_PARTITION_BYTES,
    Slice,
    check_walk_end,
    cluster_replicas,
    list_segments,
    looks_like_stores,
    most_complete,
    parse_stores,
    plan,
    read_bytes,
    readable_end,
)
from .schema import FULL_SCHEMA, check_schema

MAX_OFFSET = 2**63 - 1
DEFAULT_BATCH_ROWS = 65536


def _bool(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"expected true or false, got {value!r}")
    return text == "true"


def _int(options: dict[str, str], key: str, default: int) -> int:
    value = options.get(key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"option {key} must be an integer, got {value!r}") from None


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """The batch source's options, parsed and checked once, on the driver."""

    stores: tuple[tuple[str, str], ...]  # (broker group, store directory)
    topics: frozenset[str] | None = None
    start_offset: int = 0
    end_offset: int = MAX_OFFSET
    verify_crc: bool = False
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    batch_rows: int = DEFAULT_BATCH_ROWS
    push_filters: bool = True

    @classmethod
    def parse(cls, options: dict[str, str], push_filters: bool = True) -> ReadOptions:
        lowered = {k.lower(): v for k, v in options.items()}
        topics = lowered.get("topics")
        parsed = cls(
            stores=_stores(lowered),
            topics=frozenset(t.strip() for t in topics.split(",") if t.strip()) if topics else None,
            start_offset=_int(lowered, "startoffset", 0),
            end_offset=_int(lowered, "endoffset", MAX_OFFSET),
            verify_crc=_bool(lowered.get("verifycrc"), False),
            max_partition_bytes=_int(lowered, "maxpartitionbytes", DEFAULT_MAX_PARTITION_BYTES),
            batch_rows=_int(lowered, "batchrows", DEFAULT_BATCH_ROWS),
            push_filters=_bool(lowered.get("pushfilters"), push_filters),
        )
        if parsed.start_offset < 0 or parsed.end_offset < parsed.start_offset:
            raise ValueError(
                f"need 0 <= startOffset <= endOffset, got {parsed.start_offset}, {parsed.end_offset}"
            )
        if parsed.max_partition_bytes <= 0 or parsed.batch_rows <= 0:
            raise ValueError("maxPartitionBytes and batchRows must be positive")
        return parsed


    @property
    def path(self) -> str:
        """The one store's directory (a read of one group)."""
        return self.stores[0][1]


def _stores(lowered: dict[str, str]) -> tuple[tuple[str, str], ...]:
    given = [k for k in ("path", "stores", "clusterdir") if lowered.get(k)]
    if len(given) != 1:
        raise ValueError('replog needs one of: a store directory .load("/path/to/store"), '
                         '.load("broker-a=/path/a,broker-b=/path/b") or .option("stores", ...), '
                         '.option("clusterDir", DIR)' + (f"; got {', '.join(given)}"
                                                          if given else ""))
    if given[0] == "clusterdir":
        replicas = cluster_replicas(lowered["clusterdir"])
        return tuple((name, most_complete(replicas[name])) for name in sorted(replicas))
    text = lowered[given[0]]
    if given[0] == "stores" or looks_like_stores(text):
        if lowered.get("brokername"):
            raise ValueError("brokerName names a single path's group: the stores name theirs")
        return tuple(parse_stores(text))
    return ((lowered.get("brokername", ""), text),)


@dataclasses.dataclass
class SlicePartition(InputPartition):
    """One input partition: a byte slice of one segment of one group's store (picklable, read
    on an executor)."""

    slice: Slice
    broker_name: str = ""

    def __post_init__(self) -> None:
        InputPartition.__init__(self, (self.slice, self.broker_name))


@dataclasses.dataclass
class RowFilter:
    """What to keep of the records a walk finds; narrowed by pushed-down filters."""

    columns: tuple[str, ...]
    topics: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    broker_names: frozenset[str] | None = None
    min_offset: int = 0
    max_offset: int = MAX_OFFSET
    verify_crc: bool = False
    batch_rows: int = DEFAULT_BATCH_ROWS

    def keep_topics(self, topics: Sequence[Any]) -> bool:
        if not all(isinstance(t, str) for t in topics):
            return False
        wanted = frozenset(topics)
        self.topics = wanted if self.topics is None else self.topics & wanted
        return True

    def keep_queues(self, queue_ids: Sequence[Any]) -> bool:
        if not all(isinstance(q, int) and not isinstance(q, bool) for q in queue_ids):
            return False
        wanted = frozenset(queue_ids)
        self.queue_ids = wanted if self.queue_ids is None else self.queue_ids & wanted
        return True

    def keep_brokers(self, names: Sequence[Any]) -> bool:
        if not all(isinstance(n, str) for n in names):
            return False
        wanted = frozenset(names)
        self.broker_names = wanted if self.broker_names is None else self.broker_names & wanted
        return True

    def keep_offsets(self, f: Filter) -> bool:
        value = getattr(f, "value", None)
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        if isinstance(f, EqualTo):
            lo, hi = value, value + 1
        elif isinstance(f, GreaterThan):
            lo, hi = value + 1, MAX_OFFSET
        elif isinstance(f, GreaterThanOrEqual):
            lo, hi = value, MAX_OFFSET
        elif isinstance(f, LessThan):
            lo, hi = 0, value
        elif isinstance(f, LessThanOrEqual):
            lo, hi = 0, value + 1
        else:
            return False
        self.min_offset = max(self.min_offset, lo)
        self.max_offset = max(self.min_offset, min(self.max_offset, hi))
        return True

    def push(self, f: Filter) -> bool:
        """Take over ``f`` if it can be applied exactly while reading."""
        attribute: tuple[str, ...] = getattr(f, "attribute", ())
        column = attribute[0] if len(attribute) == 1 else None
        if column == "topic" and isinstance(f, EqualTo):
            return self.keep_topics([f.value])
        if column == "topic" and isinstance(f, In):
            return self.keep_topics(list(f.value))
        if column == "queueId" and isinstance(f, EqualTo):
            return self.keep_queues([f.value])
        if column == "queueId" and isinstance(f, In):
            return self.keep_queues(list(f.value))
        if column == "brokerName" and isinstance(f, EqualTo):
            return self.keep_brokers([f.value])
        if column == "brokerName" and isinstance(f, In):
            return self.keep_brokers(list(f.value))
        if column == "commitLogOffset":
            return self.keep_offsets(f)
        return False

    def select(self, recs: Records, phy_base: int) -> Records:
        offsets = recs.pos + phy_base
        mask = (offsets >= self.min_offset) & (offsets < self.max_offset)
        if self.queue_ids is not None:
            queue_ids = recs.int_field("queue_id")
            mask &= np.isin(queue_ids, np.fromiter(self.queue_ids, dtype=np.int64))
        recs = recs.select(mask)
        if self.topics is not None:
            recs = recs.select(recs.topic_in(self.topics))
        return recs


def read_slice(sl: Slice, rows: RowFilter, broker_name: str = "") -> Iterator[pa.RecordBatch]:
    """Decode the records of one slice that pass ``rows``, in batches of ``rows.batch_rows``."""
    buf = read_bytes(sl.path, sl.lo, sl.hi)
    phy_base = sl.base + sl.lo
    found = walk(buf, phy_base, verify_crc=rows.verify_crc)
    check_walk_end(sl, found.stop, found.end, found.reason)
    recs = rows.select(Records(buf, found.starts), phy_base)
    for i in range(0, len(recs), rows.batch_rows):
        chunk = recs.select(slice(i, i + rows.batch_rows))
        yield decode(chunk, rows.columns, broker_name)


class ReplogReader(DataSourceReader):
    """Batch reader without filter pushdown (``pushFilters=false``)."""

    def __init__(self, opts: ReadOptions, schema: StructType):
        self.opts = opts
        self.rows = RowFilter(
            columns=check_schema(schema),
            topics=opts.topics,
            min_offset=opts.start_offset,
            max_offset=opts.end_offset,
            verify_crc=opts.verify_crc,
            batch_rows=opts.batch_rows,
        )

    def partitions(self) -> list[InputPartition]:
        rows = self.rows
        if rows.topics == frozenset() or rows.queue_ids == frozenset():
            return []
        if rows.min_offset >= rows.max_offset:
            return []
        out: list[InputPartition] = []
        for name, path in self.opts.stores:
            if rows.broker_names is not None and name not in rows.broker_names:
                continue
            segments = list_segments(path)
            end = readable_end(path, segments)
            slices = plan(segments, rows.min_offset, rows.max_offset, end,
                          self.opts.max_partition_bytes)
            out += [SlicePartition(sl, name) for sl in slices]
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SlicePartition):  # Spark's stand-in for "no partitions"
            return iter(())
        return read_slice(partition.slice, self.rows, partition.broker_name)


class PushdownReader(ReplogReader):
    """Batch reader that takes over topic, queueId and commitLogOffset filters."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            if not self.rows.push(f):
                yield f


class ReplogDataSource(DataSource):
    """The ``replog`` format: batch and streaming reads, batch and streaming writes.

    This class is what Spark discovers (``pyspark_replog``) on any session. Spark refuses a
    reader that implements ``pushFilters`` unless ``spark.sql.python.filterPushdown.enabled``
    is on (off by default), and the reader cannot see that setting, so this one pushes filters
    only when asked (``pushFilters=true``); Spark then filters the rows itself.
    ``common.pipeline.register`` turns the setting on and registers PushdownDataSource."""

    PUSH_FILTERS_DEFAULT = False

    @classmethod
    def name(cls) -> str:
        return "replog"

    def schema(self) -> StructType:
        return FULL_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = ReadOptions.parse(dict(self.options), self.PUSH_FILTERS_DEFAULT)
        cls = PushdownReader if opts.push_filters else ReplogReader
        return cls(opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .stream import ReplogStreamReader

        return ReplogStreamReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink import ReplogWriter

        return ReplogWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import ReplogStreamWriter

        return ReplogStreamWriter(dict(self.options), schema, overwrite)


class PushdownDataSource(ReplogDataSource):
    """The ``replog`` format on a session with Python filter pushdown on (``register``): topic
    and offset filters prune segments and records before they are decoded."""

    PUSH_FILTERS_DEFAULT = True
