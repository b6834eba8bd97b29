"""The one trust boundary: what a client may put in a message and in a request.

Every entry path (the client port's requests, in-process calls, the gRPC front end, the
console) holds what a client sends to these rules before it reaches a processor or the store;
the C paths enforce the same rules and tests hold them to these. Each rule answers with the
reason a value is refused, or None: the caller turns a reason into its own refusal.
``docs/security.md`` lists every entry path, what it checks here, and the test that holds it.
"""

from __future__ import annotations

from collections.abc import Mapping

from common.core import timer, transaction
from common.core.message import NAME_VALUE_SEP, PROPERTY_REAL_TOPIC, PROPERTY_SEP, is_system_topic
from common.core.pop import POP_RECORD
from common.format.acl import PUB, Account

SEPARATORS = (NAME_VALUE_SEP, PROPERTY_SEP)

# properties only the broker writes: a client's message carrying one is refused
BROKER_ONLY_PROPERTIES = frozenset((*timer.RESERVED, *transaction.RESERVED, POP_RECORD))


def has_separator(text: str) -> bool:
    """Whether ``text`` holds a property separator (``\\x01`` or ``\\x02``)."""
    return NAME_VALUE_SEP in text or PROPERTY_SEP in text


def text_refusal(text: str) -> str | None:
    """Why a string bound for a record (tags, keys, a property's name or value) is refused."""
    if NAME_VALUE_SEP in text or PROPERTY_SEP in text:
        return "may not hold \\x01 or \\x02 (RocketMQ's property separators)"
    return None


def topic_refusal(topic: str) -> str | None:
    """Why a client may not name ``topic`` as the topic of a record it sends or reads."""
    if is_system_topic(topic):
        return f"{topic} is a system topic: only the broker writes and reads it"
    return None


def record_refusal(found_topic: str) -> str | None:
    """Why a client may not have a record it named by CommitLog offset, msgId or receipt
    handle: one of a system topic (a half not yet ended, a timer or delayed message not yet
    due, a POP or op record) is the broker's alone. Checked on the record found, whatever the
    request's own ``topic`` says, with or without the ACL."""
    if is_system_topic(found_topic):
        return (f"the record named is of {found_topic}, a system topic: only the broker "
                "reads it (its message is not delivered yet, or is the broker's own)")
    return None


def publisher_refusal(account: Account | None, topic: str) -> str | None:
    """Why ``account`` may not be asked about, nor end, a transaction of ``topic``: only an
    account that may publish ``topic`` (PUB) sees a half's body or decides it, whatever its
    producer group allows. None: allowed (``account`` None: the ACL is off)."""
    if account is None:
        return None
    if not account.enabled:
        return f"{account.access_key} is disabled"
    denial = account.may_topic(topic, PUB)
    return None if denial is None else denial.remark("")


def end_refusal(half: Mapping[str, str], producer_group: str, topic: str,
                transaction_id: str) -> str | None:
    """Why an END_TRANSACTION naming a half (whose properties are ``half``) is refused: it
    must name the half's producer group, its real topic (the one PUB is checked on) and its
    transaction id exactly as the broker gave it. An empty id is no wildcard: the id is the
    only part of an END that was not guessable from offsets."""
    owner, real = half.get(transaction.PRODUCER_GROUP), half.get(PROPERTY_REAL_TOPIC)
    if owner != producer_group:
        return f"it belongs to producer group {owner}"
    if real != topic:
        return f"it is a message of topic {real}"
    if transaction_id != half.get(transaction.TRANSACTION_ID, ""):
        return ("its transactionId is not the one given (the broker's answer to the half's "
                "send, or its check, names it)")
    return None
