"""Transactional messages' names: what producers, the broker and the store all speak (RocketMQ's
names; the store's part is ``common/store/transaction/``, the check-back
``master/transaction_check.py``).

A producer sends a *half* message: ``TRAN_MSG=true`` and ``PGROUP`` (its producer group), the
PREPARED sysflag. The broker stores it in ``HALF_TOPIC`` with ``REAL_TOPIC``/``REAL_QID`` and
``__transactionId__``, where no consumer reads it. END_TRANSACTION commits it (the real message
is written, sysflag COMMIT, ``preparedTransactionOffset`` naming the half) or rolls it back;
either writes an *op* record to ``OP_TOPIC`` (tag ``d``, body the half's queue offset).

replog's own, set by the broker only (a SEND carrying one is refused): ``HALF_ORIGIN`` names
the first half of a transaction (its CommitLog offset) on every record of it written after:
the half's copies a check re-appends, the commit and the op, and is indexed, so the state of a
transaction is one look-up wherever its records are; ``OP_STATE`` says on an op what was
decided (RocketMQ's op body says only that it was).
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Mapping

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # whose offset in HALF_TOPIC is the check's progress
OP_TAG = "d"

TRAN_MSG = "TRAN_MSG"
PRODUCER_GROUP = "PGROUP"
# set by the broker on each half it stores (a client's value is replaced): the id an END
# must name, random so that nobody who was not told it can end the transaction
TRANSACTION_ID = "__transactionId__"
CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
HALF_ORIGIN = "__TRAN_HALF"
OP_STATE = "__TRAN_STATE"
# set by the broker only: a forged HALF_ORIGIN or OP_STATE would resolve another transaction
RESERVED = (HALF_ORIGIN, OP_STATE, CHECK_TIMES)

# SYSFLAG transaction bits (RocketMQ MessageSysFlag)
SYSFLAG_TRANSACTION_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC


class TransactionState(enum.Enum):
    """A local transaction's outcome, as a producer's checker or END_TRANSACTION tells it."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"  # not known yet: the broker asks again later

    @property
    def sys_flag(self) -> int:
        return {TransactionState.COMMIT: TRANSACTION_COMMIT_TYPE,
                TransactionState.ROLLBACK: TRANSACTION_ROLLBACK_TYPE}.get(self, 0)

    @classmethod
    def of_sys_flag(cls, value: int) -> TransactionState:
        """END_TRANSACTION's ``commitOrRollback`` (0x8, 0xC; 0: not known yet)."""
        kind = value & SYSFLAG_TRANSACTION_MASK
        if kind == TRANSACTION_COMMIT_TYPE:
            return cls.COMMIT
        if kind == TRANSACTION_ROLLBACK_TYPE:
            return cls.ROLLBACK
        return cls.UNKNOWN


def is_half(props: Mapping[str, str] | None) -> bool:
    """A half message's properties (``TRAN_MSG=true``); None or empty: not one."""
    return props is not None and props.get(TRAN_MSG, "").lower() == "true"


def new_transaction_id() -> str:
    """A half's transaction id, chosen by the broker: 128 random bits, not derived from any
    offset or key a client could know. It travels in the half's record (``TRANSACTION_ID``),
    so every replica, a restarted broker and a new master after a failover hold it."""
    return secrets.token_hex(16).upper()
