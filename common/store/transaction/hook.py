"""The half message put hook: registered first, so a delay or a timer never takes a half."""

from __future__ import annotations

from common.core.errors import PutStatus
from common.core.message import (
    PROPERTY_DELAY,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_KEY,
    Message,
)
from common.core.timer import requested as timer_requested
from common.core.transaction import (
    CHECK_MAX_TOPIC,
    HALF_TOPIC,
    PRODUCER_GROUP,
    SYSFLAG_TRANSACTION_MASK,
    TRAN_MSG,
    TRANSACTION_ID,
    is_half,
)
from common.store.commit_log import PutResult, refused

BROKERS_OWN = (HALF_TOPIC, CHECK_MAX_TOPIC)


class HalfHook:
    name = "transaction"
    triggers = frozenset((TRAN_MSG,))

    def __init__(self, indexed: bool):
        self.indexed = indexed  # the IndexFile is on: a transaction's records can be found
        self.refused = 0

    def before_put(self, msg: Message, queue_id: int) -> tuple[Message, int] | PutResult | None:
        if msg.topic in BROKERS_OWN or not is_half(msg.properties):
            return None  # the broker's own copies of a half (checked again, given up) go as is
        problem = self._problem(msg)
        if problem:
            self.refused += 1
            return refused(PutStatus.MESSAGE_ILLEGAL, problem)
        props = dict(msg.properties)
        props[PROPERTY_REAL_TOPIC] = msg.topic
        props[PROPERTY_REAL_QID] = str(queue_id)
        if PROPERTY_UNIQ_KEY in props:
            props.setdefault(TRANSACTION_ID, props[PROPERTY_UNIQ_KEY])
        return Message(HALF_TOPIC, msg.body, tags=msg.tags, keys=msg.keys, properties=props,
                       flag=msg.flag, reconsume_times=msg.reconsume_times,
                       sys_flag=msg.sys_flag & ~SYSFLAG_TRANSACTION_MASK), 0

    def _problem(self, msg: Message) -> str:
        if not self.indexed:
            return ("transactional messages need the IndexFile (messageIndexEnable): it is how "
                    "a transaction's end is found, so that it is decided once")
        if not msg.properties.get(PRODUCER_GROUP):
            return "a half message names its producer group (PGROUP): the check-back asks it"
        if msg.delay_level or PROPERTY_DELAY in msg.properties \
                or timer_requested(msg.properties):
            return "a transactional message cannot be delayed or timed"
        return ""
