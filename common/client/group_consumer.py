"""``GroupConsumer``: consume topics as one member of a consumer group, queues shared out.

What Kafka's ``KafkaConsumer.subscribe`` + ``poll`` and RocketMQ's ``DefaultLitePullConsumer``
give::

    with GroupConsumer(servers, group="billing", topics=["orders"]) as c:
        while running:
            for msg in c.poll(timeout_ms=1000):
                handle(msg)

* **Membership.** A thread sends CONSUMER_HEARTBEAT to the group's master every
  ``heartbeat_ms``; the answer lists the group's live members (``common/broker/consumer_groups.py``).
  A member that stops heartbeating is dropped after ``session_timeout_ms`` (10 s, as Kafka's
  ``session.timeout.ms`` bounds it: long enough that a stalled VM is not a departure);
  ``close`` leaves at once.
* **Assignment.** Every member sorts the members and each topic's queues the same way and takes
  its share of each topic with RocketMQ's AllocateMessageQueueAveragely, so members agree
  without talking to each other, and the master can check a commit against it (fencing).
  The thread re-reads queue counts too, so a topic that grows is picked up.
* **Offsets: at least once.** ``poll`` returns the messages of one queue at a time (round
  robin over the assigned queues, long-polling when all are empty) and commits, at the next
  ``poll``, ``commit`` or ``close`` and before a queue is given up, the offsets of everything
  it returned before: as Kafka's ``enable.auto.commit`` does at ``poll``. A member that dies
  between a poll and the next leaves the messages of that poll to be consumed again by the
  queue's next owner. During a rebalance two members may briefly read one queue (the one
  giving it up has not polled since): duplicates, never a gap. A queue the group never
  committed starts at ``start``: ``"latest"`` (Kafka's and RocketMQ's default: only new
  messages) or ``"earliest"``.

* **Retries and dead letters** (RocketMQ's ``RECONSUME_LATER``). ``reconsume_later(msg)`` on a
  message of the last ``poll`` asks the master to store a copy in the group's retry topic
  ``%RETRY%<group>``, due after a delay that grows with each retry (delay level 3 + the times it
  came back: 10 s, 30 s, 1 min, ...); after ``max_reconsume_times`` (None: the group's
  ``retryMaxTimes``, 16 unless configured) the copy goes to the
  dead-letter topic ``%DLQ%<group>`` instead, which this consumer does not read. Every member
  reads the retry topic besides ``topics`` (from its start: a retry is never skipped), and a
  retried message comes back under the topic it was sent to, with ``reconsume_times`` counting
  its returns. The original's offset is committed at the next ``poll`` as usual: the copy is
  stored first. When the copy cannot be stored (the call raises) or is not acknowledged as a
  send would be (a result other than SEND_OK), the member rewinds that queue to the message,
  so the next polls return it (and what followed it) again: at least once.

* **Control** (as Kafka's consumer gives it): ``auto_commit=False`` leaves committing to the
  caller (``commit()`` commits everything returned so far; ``close`` then commits nothing);
  ``seek(topic, queue, offset)`` replays or skips an assigned queue; ``position`` reads it;
  ``on_revoked(queues)`` and ``on_assigned(queues)`` are called on the polling thread, inside
  ``poll``, with the queues a rebalance takes away (before they are forgotten) and gives. There
  is no join barrier as in Kafka's group protocol: the queues have moved already when
  ``on_revoked`` runs, so the master may refuse a commit for them there (the new owner then
  reads from the last commit that landed: duplicates, never a gap).

* **Broadcasting** (RocketMQ's ``MessageModel.BROADCASTING``; Kafka's ``assign`` with offsets
  kept by the application): with ``model="broadcasting"`` every member reads every queue of
  ``topics``, so each gets every message. A member keeps its own offsets, in a local file
  (RocketMQ's LocalFileOffsetStore), ``offsets_path`` or by default
  ``~/.replog_offsets/<host>@<client_id or DEFAULT>/<group>/offsets.json``: a restarted member
  resumes where it committed, and the broker holds no offsets, members or retry topic for it.
  A failed message is not retried (RocketMQ drops it in this model): ``reconsume_later``
  refuses.

* **Many broker groups.** Over a cluster of several broker groups a queue is
  ``(topic, queue_id, broker_name)`` (with one group it stays ``(topic, queue_id)``). The
  heartbeat goes to every group's master, each of which answers the members it knows; the
  members share each topic's queues over all groups, (group, id) in RocketMQ's order, with
  AllocateMessageQueueAveragely, the queues of each group by the member list of that group's
  master: exactly what that master computes when it fences a commit, so the fence and the
  allocation agree group by group even while a member's heartbeat reached one master and not
  yet another. Offsets are committed to the master of the queue's group; pulls go to that
  group (a slave while it has no master, as ``read_from`` says). The route table is asked
  again at every heartbeat, so a topic grown or a group added is used within one.

Failover: the client follows each group's master (the highest epoch) like any client; while
none answers within ``timeout_ms``, ``poll`` raises the BrokerError and the caller polls
again. The new master knows the group's offsets (a slave copies them, ``slave/config_sync.py``)
and learns the members from their next heartbeats. Over several broker groups the other
groups' queues are read and committed on meanwhile (the member list of a group without a
master is the last one its master answered).

Not thread-safe (like KafkaConsumer): one thread polls; the heartbeat thread only reports.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Self

from common.client import Consumer, SendResult
from common.client.routing import RouteTable
from common.core.allocation import allocate_averagely
from common.core.errors import BrokerError, PullStatus, ResponseCode, SendStatus
from common.core.message import (
    PROPERTY_RETRY_TOPIC,
    RETRY_PREFIX,
    MessageExt,
    retry_topic,
)
from common.format.tables import atomic_write_json, parse_offsets, read_json

log = logging.getLogger("replog.group_consumer")

LONG_POLL_MS = 500  # one empty round over the queues, then wait this long on one of them
STARTS = ("latest", "earliest")
MODELS = ("clustering", "broadcasting")

# (topic, queue id), or over several broker groups (topic, queue id, broker group)
Queue = tuple[Any, ...]


def _group(queue: Queue) -> str | None:
    return queue[2] if len(queue) > 2 else None


def _name(queue: Queue) -> str:
    return f"{queue[2]}:{queue[0]}/{queue[1]}" if len(queue) > 2 else f"{queue[0]}/{queue[1]}"


class LocalOffsets:
    """A broadcasting member's offsets in a file of consumerOffset.json's shape
    (``{"offsetTable": {"topic@group": {"queueId": offset}}}``), written atomically at each
    commit; an unreadable file is refused at start (ValueError naming it), never overwritten.
    Other groups' entries in the file are written back as they were read. Over several broker
    groups the offsets of each broker group's queues are under ``"brokerOffsetTable":
    {brokerName: {"topic@group": {"queueId": offset}}}`` beside it."""

    def __init__(self, path: Path, group: str):
        self.path = path
        self.group = group
        doc = read_json(path)
        table = parse_offsets(doc, str(path)) if doc is not None else {}
        self._offsets: dict[Queue, int] = {}
        self._others: dict[str | None, dict[str, dict[str, int]]] = {}
        brokers = doc.get("brokerOffsetTable", {}) if isinstance(doc, dict) else {}
        if not isinstance(brokers, dict):  # a bad file: refused like parse_offsets refuses
            raise ValueError(f"{path}: brokerOffsetTable must be a JSON object")  # noqa: TRY004
        tables: dict[str | None, dict[str, dict[int, int]]] = {None: table}
        for broker, inner in brokers.items():
            tables[broker] = parse_offsets({"offsetTable": inner}, f"{path} ({broker})")
        for broker, entries in tables.items():
            for key, queues in entries.items():
                topic, _, owner = key.rpartition("@")
                if owner == group:
                    self._offsets.update({
                        ((topic, q) if broker is None else (topic, q, broker)): o
                        for q, o in queues.items()})
                else:
                    self._others.setdefault(broker, {})[key] = {
                        str(q): o for q, o in queues.items()}

    def get(self, queue: Queue) -> int:
        return self._offsets.get(queue, -1)

    def put_all(self, offsets: dict[Queue, int]) -> None:
        self._offsets.update(offsets)
        tables: dict[str | None, dict[str, dict[str, int]]] = {
            b: dict(t) for b, t in self._others.items()}
        for queue, offset in sorted(self._offsets.items(), key=lambda kv: repr(kv[0])):
            table = tables.setdefault(_group(queue), {})
            table.setdefault(f"{queue[0]}@{self.group}", {})[str(queue[1])] = offset
        doc: dict[str, Any] = {"offsetTable": tables.pop(None, {})}
        if tables:
            doc["brokerOffsetTable"] = dict(sorted(tables.items()))
        atomic_write_json(self.path, doc)


def default_offsets_path(group: str, client_id: str | None) -> Path:
    """RocketMQ's ``~/.rocketmq_offsets/<clientId>/<group>/offsets.json``, under our name."""
    instance = f"{socket.gethostname()}@{client_id or 'DEFAULT'}"
    return Path.home() / ".replog_offsets" / instance / group / "offsets.json"


class GroupConsumer:
    def __init__(self, servers: str | Iterable[str], group: str, topics: Iterable[str], *,
                 start: str = "latest", heartbeat_ms: int = 1000,
                 session_timeout_ms: int = 10_000, max_messages: int = 32,
                 timeout_ms: int = 10_000, client_id: str | None = None,
                 max_reconsume_times: int | None = None,
                 auto_commit: bool = True,
                 on_assigned: Callable[[list[Queue]], object] | None = None,
                 on_revoked: Callable[[list[Queue]], object] | None = None,
                 model: str = "clustering", offsets_path: str | Path | None = None,
                 key: str | os.PathLike[str] | None = None,
                 server_key: str | os.PathLike[str] | Mapping[str, Any] | None = None):
        """``key``/``server_key``: CURVE, as for ``Consumer`` (docs/security.md)."""
        if start not in STARTS:
            raise ValueError(f"start must be one of {STARTS}, not {start!r}")
        if model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, not {model!r}")
        if offsets_path is not None and model != "broadcasting":
            raise ValueError("offsets_path is for model='broadcasting' (clustering offsets are "
                             "kept by the master)")
        if max_reconsume_times is not None and not 0 <= max_reconsume_times <= 10_000:
            raise ValueError(f"max_reconsume_times must be in 0..10000, not {max_reconsume_times}")
        self.group = group
        self.topics = sorted(set(topics))
        self.retry_topic = retry_topic(group)
        self.model = model
        self.broadcasting = model == "broadcasting"
        # broadcasting reads no retry topic: nothing is sent back in that model
        self._read_topics = sorted(
            set(self.topics) if self.broadcasting else {*self.topics, self.retry_topic})
        self._local: LocalOffsets | None = None
        if self.broadcasting:
            self._local = LocalOffsets(
                Path(offsets_path) if offsets_path is not None
                else default_offsets_path(group, client_id), group)
        self.max_reconsume_times = max_reconsume_times
        self.auto_commit = auto_commit
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.start = start
        self.heartbeat_ms = heartbeat_ms
        self.session_timeout_ms = session_timeout_ms
        self.max_messages = max_messages
        self.client_id = client_id or (
            f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}")
        self._consumer = Consumer(servers, group=group, timeout_ms=timeout_ms, key=key,
                                  server_key=server_key)
        self._lock = threading.Lock()
        # members (per broker group: None with one group), every queue (sorted)
        self._view: tuple[dict[str | None, list[str]], list[Queue]] = ({}, [])
        self._multi = False  # the view applied has several broker groups (queues name theirs)
        self._route_multi = False  # the last route table had several (heartbeat thread)
        self._view_version = 0
        self._applied_version = -1
        self._assigned: list[Queue] = []
        self._positions: dict[Queue, int] = {}  # next offset to pull = consumed up to here
        self._committed: dict[Queue, int] = {}
        self._turn = 0
        self._last: tuple[Queue, dict[int, int]] | None = None  # last poll: queue, phy -> offset
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._closed = False
        try:
            self._refresh()  # the first view before the first poll
        except BrokerError:
            self._consumer.close()
            raise
        self._thread = threading.Thread(target=self._run, name="replog-group-heartbeat",
                                        daemon=True)
        self._thread.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- what a caller sees ------------------------------------------------------------------
    def assignment(self) -> list[Queue]:
        """The queues this member reads now (as of its last ``poll``)."""
        return list(self._assigned)

    def members(self) -> list[str]:
        """The consumer group's live members (over several broker groups: every member any
        group's master knows)."""
        with self._lock:
            return sorted({m for ms in self._view[0].values() for m in ms})

    def position(self, topic: str, queue_id: int, broker_name: str | None = None) -> int:
        """The next offset ``poll`` reads in an assigned queue (KeyError if not assigned)."""
        return self._positions[self._key(topic, queue_id, broker_name)]

    def _key(self, topic: str, queue_id: int, broker_name: str | None) -> Queue:
        """The queue of (topic, id[, group]): the group may be left out while one assigned
        queue has that topic and id."""
        if not self._multi:
            return (topic, queue_id)
        if broker_name is not None:
            return (topic, queue_id, broker_name)
        held = [q for q in self._positions if q[0] == topic and q[1] == queue_id]
        if len(held) == 1:
            return held[0]
        raise ValueError(f"{topic}/{queue_id} is assigned in groups "
                         f"{', '.join(str(_group(q)) for q in held) or 'none'}: "
                         "name its group (broker_name=)")

    def seek(self, topic: str, queue_id: int, offset: int,
             broker_name: str | None = None) -> None:
        """Read an assigned queue from ``offset`` on (Kafka's ``seek``): replay, or skip ahead.
        Committed like any progress; an offset outside the queue is moved to its nearest end
        at the next pull (the broker answers OFFSET_ILLEGAL with where to go)."""
        queue = self._key(topic, queue_id, broker_name)
        if queue not in self._positions:
            raise ValueError(f"{_name(queue)} is not assigned to this member "
                             f"({', '.join(_name(q) for q in self._assigned) or 'none'})")
        if offset < 0:
            raise ValueError(f"offset must be >= 0, not {offset}")
        self._positions[queue] = offset

    def poll(self, timeout_ms: int = 1000) -> list[MessageExt]:
        """Messages of one assigned queue ([] when none arrived within ``timeout_ms``); first
        commits what the previous polls returned (unless ``auto_commit`` is off)."""
        if self._closed:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, "group consumer is closed", False)
        if self.auto_commit:
            self.commit()
        self._last = None
        self._rebalance_if_changed()
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            found = self._one_round()
            if found:
                return found
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return []
            if not self._assigned:  # nothing to read until the membership or topics change
                self._changed.wait(left_ms / 1000.0)
                self._changed.clear()
                self._rebalance_if_changed()
                continue
            queue = self._assigned[self._turn % len(self._assigned)]
            self._turn += 1
            found = self._pull(queue, suspend_ms=min(LONG_POLL_MS, left_ms))
            if found:
                return found
            self._rebalance_if_changed()

    def reconsume_later(self, msg: MessageExt, delay_level: int = 0) -> SendResult:
        """This member failed ``msg`` (one of the last ``poll``): it comes back later, through
        the group's retry topic, or goes to its DLQ after ``max_reconsume_times`` returns
        (``delay_level`` -1: at once). ``delay_level`` 0 lets the broker choose (3 + the times
        it came back). Returns the copy's SendResult (its ``topic`` says retry or DLQ).

        If the copy is not stored (BrokerError, raised) or not acknowledged as a send would be
        (a status other than SEND_OK, returned), the message's queue is rewound to it: the
        next polls return it again rather than commit past it."""
        if self.broadcasting:
            raise ValueError("a broadcasting consumer has no retry topic: RocketMQ drops a "
                             "message that fails in this model; handle or log it yourself")
        last = self._last
        if last is None or msg.commit_log_offset not in last[1]:
            raise ValueError(
                "reconsume_later takes a message of the last poll (its offset is committed at "
                "the next poll)")
        queue, offsets = last
        try:
            result = self._consumer.send_back(msg, delay_level, self.max_reconsume_times)
        except BrokerError:
            self._rewind(queue, offsets[msg.commit_log_offset])
            raise
        if result.status != SendStatus.SEND_OK:
            self._rewind(queue, offsets[msg.commit_log_offset])
        return result

    def _rewind(self, queue: Queue, offset: int) -> None:
        if queue in self._positions and self._positions[queue] > offset:
            log.warning("event=group_rewind group=%s topic=%s queue=%d offset=%d",
                        self.group, queue[0], queue[1], offset)
            self._positions[queue] = offset

    def commit(self) -> None:
        """Commit the offsets of every message ``poll`` returned (synchronously). The master
        refuses a queue this member no longer owns (its session ran out, or the queue moved):
        that position is dropped, so it cannot move back what the queue's new owner committed
        (the messages come again: at least once). A broadcasting member writes its offsets
        file instead."""
        if self._local is not None:
            changed = {q: o for q, o in self._positions.items() if self._committed.get(q) != o}
            if changed:
                self._local.put_all(changed)
                self._committed.update(changed)
            return
        for queue, offset in list(self._positions.items()):
            if self._committed.get(queue) == offset:
                continue
            try:
                self._consumer.commit_offset(queue[0], queue[1], offset, self.client_id,
                                             broker_name=_group(queue))
            except BrokerError as e:
                if e.code != ResponseCode.CONSUMER_NOT_ONLINE:
                    raise
                log.warning("event=group_commit_fenced group=%s client=%s topic=%s queue=%d",
                            self.group, self.client_id, queue[0], queue[1])
                self._positions.pop(queue, None)  # its new owner reads it; ours is stale
                self._committed.pop(queue, None)
                continue
            self._committed[queue] = offset

    def close(self) -> None:
        """Commit (with ``auto_commit``), leave the group (its queues move to the others at
        once), stop."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._changed.set()
        self._thread.join(5.0)
        try:
            if self.auto_commit:
                self.commit()
            if not self.broadcasting and self._multi:
                self._consumer.heartbeat_groups(self.client_id, self.session_timeout_ms,
                                                leave=True)
            elif not self.broadcasting:
                self._consumer.heartbeat(self.client_id, self.session_timeout_ms, leave=True)
        except BrokerError as e:
            log.warning("event=group_consumer_close_incomplete group=%s error=%s", self.group, e)
        finally:
            self._consumer.close()

    # ---- reading -----------------------------------------------------------------------------
    def _one_round(self) -> list[MessageExt]:
        for _ in range(len(self._assigned)):
            queue = self._assigned[self._turn % len(self._assigned)]
            self._turn += 1
            found = self._pull(queue, suspend_ms=0)
            if found:
                return found
        return []

    def _pull(self, queue: Queue, suspend_ms: int) -> list[MessageExt]:
        offset = self._positions.get(queue)
        if offset is None:
            # a commit of it was fenced (a new master that had not heard this member's
            # heartbeat yet, or the queue moved) and no rebalance took it away since: read on
            # from what the group committed (at least once)
            offset = self._positions[queue] = self._committed[queue] = self._start_offset(queue)
        pr = self._consumer.pull(queue[0], queue[1], offset, self.max_messages,
                                 suspend_ms=suspend_ms, broker_name=_group(queue))
        if pr.status == PullStatus.FOUND and pr.messages:
            self._positions[queue] = pr.next_begin_offset
            self._last = (queue, {m.commit_log_offset: m.queue_offset for m in pr.messages})
            if queue[0] == self.retry_topic:  # shown under the topic it was sent to
                for m in pr.messages:
                    m.topic = m.properties.get(PROPERTY_RETRY_TOPIC, m.topic)
            return pr.messages
        if pr.status == PullStatus.OFFSET_ILLEGAL:  # retention deleted them, or a new master
            log.warning("event=group_offset_moved group=%s topic=%s queue=%d from=%d to=%d",
                        self.group, queue[0], queue[1], offset, pr.next_begin_offset)
            self._positions[queue] = pr.next_begin_offset
        return []

    # ---- membership and assignment -------------------------------------------------------------
    def _rebalance_if_changed(self) -> None:
        with self._lock:
            if self._view_version == self._applied_version:
                return
            members, queues = self._view
            version = self._view_version
        self._multi = None not in members
        if self.broadcasting:
            mine = list(queues)  # every queue of the topics read, sorted
        elif None in members:  # one broker group: its queue ids
            mine = [q for topic in self._read_topics for q in allocate_averagely(
                [x for x in queues if x[0] == topic], members[None], self.client_id)]
        else:
            mine = allocate_over_groups(self._read_topics, queues, members, self.client_id)
        revoked = [q for q in self._assigned if q not in mine]
        if revoked and self.on_revoked is not None:
            self.on_revoked(revoked)  # positions still held: a commit() there may still land
        for queue in revoked:  # with auto_commit, committed by commit() at the top of poll
            self._positions.pop(queue, None)
            self._committed.pop(queue, None)
        for queue in mine:
            if queue not in self._positions:
                self._positions[queue] = self._start_offset(queue)
                self._committed[queue] = self._positions[queue]
        added = [q for q in mine if q not in self._assigned]
        if mine != self._assigned:
            log.info("event=group_rebalanced group=%s client=%s members=%d queues=%s",
                     self.group, self.client_id,
                     len({m for ms in members.values() for m in ms}),
                     ",".join(map(_name, mine)) or "-")
        self._assigned = mine
        self._applied_version = version
        if added and self.on_assigned is not None:
            self.on_assigned(added)

    def _start_offset(self, queue: Queue) -> int:
        group = _group(queue)
        committed = (self._local.get(queue) if self._local is not None
                     else self._consumer.fetch_offset(queue[0], queue[1], broker_name=group))
        if committed >= 0:
            return committed
        if self.start == "earliest" or queue[0].startswith(RETRY_PREFIX):
            return self._consumer.min_offset(queue[0], queue[1], broker_name=group)
        return self._consumer.max_offset(queue[0], queue[1], broker_name=group)

    def _refresh(self) -> None:
        """One heartbeat and a look at the topics' queues (the heartbeat thread); a
        broadcasting member is no member of anything and sends none. Over several broker
        groups: a heartbeat to every group's master and a fresh route table."""
        table = self._consumer.route_table(fresh=self._route_multi)
        self._route_multi = len(table.groups) > 1
        if self._route_multi:
            members, queues = self._refresh_groups(table)
        else:
            members = {None: [self.client_id] if self.broadcasting
                       else self._consumer.heartbeat(self.client_id, self.session_timeout_ms)}
            queues = []
            for topic in self._read_topics:
                try:
                    queues += [(topic, q) for q in range(self._consumer.queue_nums(topic))]
                except BrokerError as e:
                    if e.code != ResponseCode.TOPIC_NOT_EXIST:
                        raise
        with self._lock:
            if (members, queues) != self._view:
                self._view = (members, queues)
                self._view_version += 1
                self._changed.set()

    def _refresh_groups(self, table: RouteTable
                        ) -> tuple[dict[str | None, list[str]], list[Queue]]:
        queues: list[Queue] = [(topic, mq.queue_id, mq.broker_name)
                               for topic in self._read_topics for mq in table.queues(topic)]
        if self.broadcasting:
            return {name: [self.client_id] for name in table.group_names}, queues
        answered = self._consumer.heartbeat_groups(self.client_id, self.session_timeout_ms)
        with self._lock:
            before = self._view[0]
        members: dict[str | None, list[str]] = {}
        for name in table.group_names:
            known = answered.get(name)
            # a group without a master now: the list its master answered last (it fences by
            # whatever list its next master learns; commits wait for that master anyway)
            members[name] = known if known is not None else list(before.get(name, []))
        return members, queues

    def _run(self) -> None:
        while not self._stop.wait(self.heartbeat_ms / 1000.0):
            try:
                self._refresh()
            except BrokerError as e:  # no master for now: keep the last view, try again
                log.warning("event=group_heartbeat_failed group=%s error=%s", self.group, e)

    def status(self) -> dict[str, Any]:
        return {"clientId": self.client_id, "members": self.members(),
                "assignment": [_name(q) for q in self._assigned],
                "positions": {_name(q): o for q, o in self._positions.items()}}


def allocate_over_groups(topics: Iterable[str], queues: list[Queue],
                         members: dict[str | None, list[str]], me: str) -> list[Queue]:
    """The queues ``me`` reads over several broker groups: per topic, its queues over every
    group ((group, id) in RocketMQ's order) shared by AllocateMessageQueueAveragely, each
    group's queues by the members that group's master knows (what its commit fence computes,
    ``common/broker/consumer_groups.py``)."""
    mine: list[Queue] = []
    for topic in topics:
        pairs = sorted((q[2], q[1]) for q in queues if q[0] == topic)
        for name in sorted({g for g, _ in pairs}):
            mine += [(topic, qid, g) for g, qid in
                     allocate_averagely(pairs, members.get(name, []), me) if g == name]
    return mine
