"""The master's common put on its native path: a run of plain SENDs of one burst of requests,
from their frames to their answers, in one C call (``common/format/_put_path.c``).

The request server hands every burst its client port read to ``PutPath.take`` (and each local
call, the gRPC front end's sends, as a burst of one); the C function
decodes each request with the same checks as every request's, makes the Python path's
decisions for a SEND (``RequestServer._serve``, ``MasterRole.send``, the store's
``put_nowait``, ``CommitLog.put``), writes the records into the segment's mapping with the
record writer's code, advances the queue offsets, leaves reput its digests and encodes the
SEND_OK answers; this module does the per-burst part around it: the gates that hold for the
whole burst, the put lock, the segment, and after the call the write position, the append
listeners (the HA service, reput) and the counters. The run stops at the first request it
does not take whole, before changing anything of it; the server serves that one by the Python
path (which takes it, or refuses it with its reason) and calls again after it.

Which requests: SEND with one body to a topic this table lists (made already, not a system
topic, a FIFO topic only with a message group), a queue id within it, no delay level, no
prepared transaction, no property the broker screens (a put hook's trigger, a timer's, a
transaction's, one only the broker sets), a record that fits before the segment's end and its
faulted-in pages, from a peer whose address is known; and SEND_BATCH of bodies alone (no
meta) on the same terms. Which brokers: a master with ASYNC_FLUSH outside controller mode. An
ASYNC_MASTER's answers are written at once; a SYNC_MASTER's run is held by its replica waits
as one put (``NativeRun``: its last byte's ack answers them all, a timeout or a missing slave
answers them all as the Python path answers each). SYNC_FLUSH (answers wait for the disk) and
controller mode (the lease's reply gate) are the Python path's, as is everything else, and
everything when the extension is not built or ``PYTHON_PUTS_REPLOG=1`` is set. The Python
path stays the reference: tests/unit/master/test_put_path.py holds the two to the same log
bytes, offsets, digests, queues and answers.

Why: a plain send cost the broker about 80 Python calls, most of them on this path, and the
broker's one I/O thread was what capped sixteen clients sending at once (docs/benchmarks.md,
issue 43).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import msgpack

from common.broker.replies import Deferred
from common.broker.tables import TopicTable
from common.core import accel
from common.core.errors import PutStatus, ResponseCode
from common.core.logs import log_event
from common.core.message import (
    PROPERTY_KEYS,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TAGS,
    SYSFLAG_TRANSACTION_PREPARED,
    host_bytes,
    is_system_topic,
)
from common.format import record, zmtp
from common.format.protocol import (
    PROTOCOL_VERSION,
    RESPONSE_MARK,
    Limits,
    RequestCode,
    Response,
    decode_request,
    encode_response,
)
from common.store.commit_log import WriteDigest
from common.store.flush import FLUSHED
from master.group_transfer import GroupTransfer, ReplicaPut

FAULT_AHEAD = 64 * 1024  # bytes faulted in at once where the allocate thread is behind
MAX_TOPICS = 100_000  # topics kept in the table (each a few dozen bytes); past it, cleared

_native = accel.load("common.format._codec")
put_sends: Callable[..., tuple[int, int, list[tuple[bytes, bytes]], int, int]] | None = getattr(
    _native, "put_sends", None)

Burst = list[tuple[bytes, list[bytes]]]
# how a SEND's and a SEND_BATCH's header begin after the array's first byte (its version and
# code, as every client packs them): a request that begins otherwise is the Python path's at
# once, without the put lock and the C call (a consumer's pulls between the puts of a burst)
_PUT_HEADS = tuple(msgpack.packb([PROTOCOL_VERSION, int(code)])[1:]
                   for code in (RequestCode.SEND, RequestCode.SEND_BATCH))
log = logging.getLogger("replog.server")


def enabled() -> bool:
    """The native path is built and not switched off (``PYTHON_PUTS_REPLOG=1``: the Python
    path for every put, to compare the two)."""
    return put_sends is not None and os.environ.get("PYTHON_PUTS_REPLOG") != "1"


class PutPath:
    """One master role's native put path; used by the request server's I/O thread only."""

    def __init__(self, store: Any, topics: TopicTable, screen: frozenset[str],
                 write_gate: Callable[[], str] | None, store_host: str,
                 waits: GroupTransfer | None = None,
                 answer_of: Callable[[int, PutStatus, dict[str, Any]], Response] | None = None):
        self._store = store
        # a SYNC_MASTER's: its replica waits hold each run until its slaves have it, and
        # ``answer_of(opaque, status, fields)`` is the role's answer for another status
        self._waits = waits
        self._answer_of = answer_of
        self._store_host = store_host  # the answers' storeHost (the msgId prefix)
        self._cl = store.commit_log
        self._topics_table = topics
        self._screen = screen  # the master role's own (timer, transaction, broker-only)
        self._write_gate = write_gate
        self._topics: dict[str, tuple[bytes, int, bool] | None] = {}
        self._hosts: dict[str, bytes] = {}
        self._conf: tuple[Any, ...] = ()
        self._made_of: tuple[Any, ...] = ()
        self._version = -1  # the topic table's, when the topics were learnt
        self._faulted = (-1, 0)  # (segment's first offset, faulted in up to) by _stop
        self.fixed_ts = 0  # tests: every record's store timestamp (0: the clock's)
        self.taken = 0  # requests served here
        self.messages = 0  # and the messages they stored
        self.declined_errors = 0  # bursts left to the Python path by an error

    def take(self, burst: Burst, start: int, peers: dict[bytes, tuple[str, int]],
             limits: Limits, room: int) -> tuple[int, list[tuple[bytes, bytes]] | Deferred, int]:
        """Serve the plain SENDs (and SEND_BATCHes) of ``burst`` from ``start`` on: the index
        of the first one not taken (``len(burst)``: all), the answers of those taken,
        (identity, ZMTP bytes) each, for the caller to write and account, and how many
        messages they stored. A SYNC_MASTER's answers come as one Deferred its replica waits
        hold (``run`` its answers once they are settled); it takes at most ``room`` requests
        (the server's in-flight room)."""
        frames = burst[start][1]
        if not frames or not frames[0].startswith(_PUT_HEADS, 1):
            return start, [], 0  # not a SEND or a SEND_BATCH: no lock, no call (a pull, ...)
        cl = self._cl
        gate = self._write_gate
        if not cl.writeable or cl._lock_since or (gate is not None and gate()):
            return start, [], 0  # the Python path refuses with the reason, or waits its turn
        conf = self._conf_for(peers, limits)
        with cl.put_lock:
            cl._lock_since = time.monotonic()
            try:
                mf = cl.queue.last_for_write()
                pos = mf.wrote_position
                stop = self._stop(mf, pos, cl.file_size - record.END_FILE_MIN_BLANK)
                taken_to, end_pos, answers, ts, messages = put_sends(  # type: ignore[misc]
                    conf, burst, start, mf.buffer, pos, stop, mf.file_from_offset,
                    self.fixed_ts, len(burst) if self._waits is None else room)
                if taken_to > start:
                    mf.wrote_position = end_pos
                    mf.store_timestamp = ts
                    cl.last_store_timestamp = ts
            except Exception as e:  # noqa: BLE001 - e.g. no new segment: the Python path's to say
                self.declined_errors += 1
                log_event(log, "native_put_declined", logging.WARNING, error=repr(e))
                return start, [], 0
            finally:
                cl._lock_since = 0.0
        if taken_to > start:
            cl._prefault(mf)
            end = mf.file_from_offset + end_pos
            for listener in cl.append_listeners:
                listener(end)
            self._store.puts += messages
            self.taken += taken_to - start
            self.messages += messages
            if self._waits is not None:
                return taken_to, self._held(answers, messages, end), messages
        return taken_to, answers, messages

    def _held(self, answers: list[tuple[bytes, bytes]], messages: int,
              end: int) -> list[tuple[bytes, bytes]] | Deferred:
        """A SYNC_MASTER's run: held until its slaves have its last byte, as each put the
        Python path holds (``MasterRole._after_append``); answered now when the status is
        known now (no slave in sync, too many waiting)."""
        assert self._waits is not None and self._answer_of is not None
        run = NativeRun(self._waits, answers, messages, self._answer_of)
        status = self._waits.admit(run, end, FLUSHED)
        if status is None:
            return run
        run.reply(status)
        return run.run or []

    def _stop(self, mf: Any, pos: int, limit: int) -> int:
        """How far this run may write: the segment's end less the end marker's room, and the
        pages faulted in. Those are the allocate thread's to fault ahead (``populated``);
        where it is behind (a segment just started), the next ``FAULT_AHEAD`` bytes are
        faulted in here, as the Python path faults each put's own pages."""
        stop = min(mf.populated, limit)
        if stop >= limit or stop >= pos + FAULT_AHEAD:
            return stop
        segment, faulted = self._faulted
        if segment == mf.file_from_offset and faulted >= pos + FAULT_AHEAD // 2:
            return max(stop, min(faulted, limit))
        end = min(pos + FAULT_AHEAD, limit)
        if not mf.fault_in(pos, end):
            return stop  # no space: the Python path refuses the put with the reason
        self._faulted = (mf.file_from_offset, end)
        return max(stop, end)

    def _conf_for(self, peers: dict[bytes, tuple[str, int]], limits: Limits) -> tuple[Any, ...]:
        """The C function's conf, made again when anything it holds was replaced."""
        cl, topics = self._cl, self._topics_table
        triggers = self._store.extensions.put_hook_triggers
        table, version, was = cl.topic_queue_table, topics.version, self._made_of
        # the same objects, not equal ones: a queue table replaced by an equal one (a
        # promotion's rebuild) must be the one the C function writes into from now on
        if was and peers is was[0] and limits is was[1] and table is was[2] \
                and cl.digests is was[3] and triggers is was[4] and version == was[5]:
            return self._conf
        made_of = (peers, limits, table, cl.digests, triggers, version)
        if topics.version != self._version:
            self._topics.clear()  # a topic made, grown or retyped: learnt again
            self._version = topics.version
        self._made_of = made_of
        screen = self._screen | (triggers if triggers is not None else frozenset())
        self._conf = (
            limits, cl.topic_queue_table, self._topics, self._learn, peers, self._hosts,
            host_bytes, screen, cl.store_ip, cl.store_port, cl._crc_len, cl.max_message_size,
            cl.digests, WriteDigest, self._store_host,
            int(RequestCode.SEND), PROPERTY_SHARDING_KEY, PROPERTY_TAGS, PROPERTY_KEYS,
            record.MAX_PROPERTIES_BYTES, cl.max_message_size + record.RECORD_SLACK_BYTES,
            SYSFLAG_TRANSACTION_PREPARED, RESPONSE_MARK[0], int(RequestCode.SEND_BATCH),
            decode_request, cl.file_size - record.END_FILE_MIN_BLANK)
        return self._conf

    def _learn(self, topic: str) -> None:
        """The C function meets a topic it has no entry for: (topic part, queues, FIFO), or
        None for one the Python path serves (a system topic, one not made yet, a bad name)."""
        if len(self._topics) >= MAX_TOPICS:
            self._topics.clear()
        nums = self._topics_table.queue_nums(topic)
        part = self._cl._topic_part(topic)
        if nums <= 0 or is_system_topic(topic) or not isinstance(part, bytes):
            self._topics[topic] = None
            return
        fifo = self._topics_table.message_type(topic) == "FIFO"
        self._topics[topic] = (part, nums, fifo)


class NativeRun(ReplicaPut):
    """A SYNC_MASTER's run of native puts, held by its replica waits as one put (its last
    byte's ack acks them all); ``run`` holds the answers the server writes once it is handed
    back: as the C function made them (SEND_OK), or made again for the status it ended with."""

    __slots__ = ("answer_of",)

    def __init__(self, owner: GroupTransfer, answers: list[tuple[bytes, bytes]], messages: int,
                 answer_of: Callable[[int, PutStatus, dict[str, Any]], Response]) -> None:
        super().__init__(owner)
        self.run = answers
        self.run_messages = messages
        self.answer_of = answer_of

    def reply(self, status: PutStatus) -> Response:
        if status is not PutStatus.PUT_OK:
            self.run = [(identity, self._again(raw, status)) for identity, raw in self.run or ()]
        return Response(ResponseCode.SUCCESS, 0, "", {}, [])  # the server writes ``run``

    def _again(self, raw: bytes, status: PutStatus) -> bytes:
        """A SEND_OK's bytes made again as the role answers ``status``, from its own fields."""
        header = raw[2:] if raw[0] & zmtp.LONG == 0 else raw[9:]
        _version, _code, opaque, _remark, fields = msgpack.unpackb(header)
        resp = self.answer_of(opaque, status, fields)
        return zmtp.encode(encode_response(resp.code, resp.opaque, resp.remark, resp.fields,
                                           resp.bodies))
