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


def op(half: MessageExt, state: TransactionState) -> Message:
    """The op record: tag ``d``, body the half's queue offset (RocketMQ's), and what was
    decided (replog's ``OP_STATE``)."""
    return Message(OP_TOPIC, str(half.queue_offset).encode(), tags=OP_TAG,
                   properties={HALF_ORIGIN: str(origin_of(half)), OP_STATE: state.value})


def checked_again(half: MessageExt) -> Message:
    """The half put back at the end of the half queue, one check more (so the check's
    progress moves on and the next round meets it again)."""
    props = {k: v for k, v in half.properties.items() if k not in ("TAGS", "KEYS")}
    props[CHECK_TIMES] = str(check_times(half) + 1)
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
