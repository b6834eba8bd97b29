"""The records a transaction writes after its half, built from the half (RocketMQ's
``endMessageTransaction``, ``putBackHalfMsgQueue`` and the op message), each carrying the
transaction's origin (``HALF_ORIGIN``: the first half's CommitLog offset)."""

from __future__ import annotations

from common.core.message import PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC, Message, MessageExt
from common.core.transaction import (
    CHECK_MAX_TOPIC,
    CHECK_TIMES,
    HALF_ORIGIN,
    HALF_TOPIC,
    OP_STATE,
    OP_TAG,
    OP_TOPIC,
    SYSFLAG_TRANSACTION_MASK,
    TRAN_MSG,
    TransactionState,
)

_NOT_CARRIED = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, TRAN_MSG, CHECK_TIMES, "TAGS", "KEYS")


def origin_of(half: MessageExt) -> int:
    """The transaction a half belongs to: its first half's CommitLog offset."""
    origin = half.properties.get(HALF_ORIGIN, "")
    return int(origin) if origin.isdigit() else half.commit_log_offset


def check_times(half: MessageExt) -> int:
    text = half.properties.get(CHECK_TIMES, "0")
    return int(text) if text.isdigit() else 0


def committed(half: MessageExt) -> tuple[Message, int]:
    """The real message: its topic and queue, sysflag COMMIT, PREPAREDTRANSACTIONOFFSET the
    half's offset, no TRAN_MSG (a consumer sees a plain message)."""
    props = {k: v for k, v in half.properties.items() if k not in _NOT_CARRIED}
    props[HALF_ORIGIN] = str(origin_of(half))
    topic = half.properties[PROPERTY_REAL_TOPIC]
    queue_id = int(half.properties.get(PROPERTY_REAL_QID, "0"))
    sys_flag = (half.sys_flag & ~SYSFLAG_TRANSACTION_MASK) | TransactionState.COMMIT.sys_flag
    return Message(topic, half.body, tags=half.tags, keys=half.keys, properties=props,
                   flag=half.flag, reconsume_times=half.reconsume_times, sys_flag=sys_flag,
                   prepared_transaction_offset=half.commit_log_offset), queue_id


OP_KEYS_MAX = 16_000  # characters of an op's KEYS (a property is at most 32,767 bytes)


def op_entry(half: MessageExt) -> tuple[int, int]:
    """What an op record says of one transaction: (its origin, the half's queue offset)."""
    return origin_of(half), half.queue_offset


def op(entries: list[tuple[int, int]], state: TransactionState) -> Message:
    """The op record of one or more transactions ended alike (``op_entry``): tag ``d``, body
    the halves' queue offsets joined by ``,`` (RocketMQ's), each origin a key
    (``HALF_ORIGIN`` + origin, so the index finds it), and what was decided (``OP_STATE``)."""
    return Message(OP_TOPIC, ",".join(str(q) for _, q in entries).encode(), tags=OP_TAG,
                   keys=[HALF_ORIGIN + str(o) for o, _ in entries],
                   properties={OP_STATE: state.value})


def op_origins(msg: MessageExt) -> list[int]:
    """The transactions an op record ends (its keys; an op written by a replog before op
    batching named its one origin in ``HALF_ORIGIN``)."""
    found = key_origins(msg.key_list())
    single = msg.properties.get(HALF_ORIGIN, "")
    if single.isdigit():
        found.append(int(single))
    return found


def key_origins(keys: tuple[str, ...] | list[str]) -> list[int]:
    """``op_origins`` from a dispatch request's keys."""
    return [int(k[len(HALF_ORIGIN):]) for k in keys
            if k.startswith(HALF_ORIGIN) and k[len(HALF_ORIGIN):].isdigit()]


def checked_again(half: MessageExt) -> Message:
    """The half put back at the end of the half queue, one check more (so the check's
    progress moves on and the next round meets it again)."""
    return put_back(half, check_times(half) + 1)


def put_back(half: MessageExt, checks: int | None = None) -> Message:
    """The half put back at the end of the half queue with ``checks`` checks (default: as
    many as it had), naming its origin."""
    props = {k: v for k, v in half.properties.items() if k not in ("TAGS", "KEYS")}
    if checks is not None:
        props[CHECK_TIMES] = str(checks)
    props[HALF_ORIGIN] = str(origin_of(half))
    return Message(HALF_TOPIC, half.body, tags=half.tags, keys=half.keys, properties=props,
                   flag=half.flag, reconsume_times=half.reconsume_times, sys_flag=half.sys_flag)


def discarded(half: MessageExt) -> Message:
    """Past ``transactionCheckMax`` checks: kept in the check-max topic, where an operator
    finds it (and can send it to its topic by hand)."""
    props = {k: v for k, v in half.properties.items() if k not in ("TAGS", "KEYS")}
    props[HALF_ORIGIN] = str(origin_of(half))
    return Message(CHECK_MAX_TOPIC, half.body, tags=half.tags, keys=half.keys,
                   properties=props, flag=half.flag, sys_flag=half.sys_flag)


def is_half_record(msg: MessageExt) -> bool:
    return msg.topic == HALF_TOPIC and PROPERTY_REAL_TOPIC in msg.properties


def is_given_up(msg: MessageExt) -> bool:
    """A half the check-back gave up (``discarded``): still open, an END still decides it."""
    return msg.topic == CHECK_MAX_TOPIC and PROPERTY_REAL_TOPIC in msg.properties
