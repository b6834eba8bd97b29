"""The one trust boundary: what a client may put in a message and in a request.

Every entry path (the client port's requests, in-process calls, the gRPC front end, the
console) holds what a client sends to these rules before it reaches a processor or the store;
the C paths enforce the same rules and tests hold them to these. Each rule answers with the
reason a value is refused, or None: the caller turns a reason into its own refusal.
``docs/security.md`` lists every entry path, what it checks here, and the test that holds it.

A record's properties are ``name\\x01value\\x02`` (``common/core/message.py``): a separator in
any string bound for a record (tags, keys, a property's name or value, a message id) would add
properties of the sender's choosing, and the last of a name wins when read.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

from common.core import timer, transaction
from common.core.message import (
    KEY_SEPARATOR,
    NAME_VALUE_SEP,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SEP,
    PROPERTY_UNIQ_KEY,
    SCHEDULE_SOURCE,
    is_system_topic,
)
from common.core.pop import POP_RECORD
from common.format.record import PROP_CRC_NAME

MAX_QUEUE_ID = 65535  # a topic's queue ids are 0 to this (RocketMQ's, and the codec's bound)
SEPARATOR_REASON = "may not hold \\x01 or \\x02 (RocketMQ's property separators)"

# Properties only the broker writes: a client's message carrying one is refused. Each is read as
# the broker's own word: the timer's marks (a forged tick stops deliveries, a forged recall drops
# a message), a transaction's (a forged origin or op state ends another's transaction), a
# revive record's kind, the schedule's delivery mark (a forged one tells the delay service a
# message was delivered), the whole-record CRC entry (a forged one at the end of the properties
# makes a reader check a CRC the writer never computed). REAL_TOPIC and REAL_QID are not here:
# a client may carry them (RocketMQ leaves them on a delivered delay message, and a client that
# forwards one keeps them); the broker sets both itself on every record it holds for later
# (schedule, timer, half), over a client's, and reads them only on those records.
BROKER_ONLY_PROPERTIES = frozenset((*timer.RESERVED, *transaction.RESERVED, POP_RECORD,
                                    SCHEDULE_SOURCE, PROP_CRC_NAME))
BROKER_ONLY_KEY_STARTS = tuple(sorted(BROKER_ONLY_PROPERTIES))  # for str.startswith


def has_separator(text: str) -> bool:
    """Whether ``text`` holds a property separator (``\\x01`` or ``\\x02``)."""
    return NAME_VALUE_SEP in text or PROPERTY_SEP in text


def text_refusal(text: str) -> str | None:
    """Why a string bound for a record (tags, keys, a property's name or value) is refused."""
    return SEPARATOR_REASON if has_separator(text) else None


def key_refusal(key: str) -> str | None:
    """Why one of a client's index keys (a KEYS entry, or its UNIQ_KEY) is refused: a
    separator, or a start that is a broker-only property's name. The index holds each watched
    property of the broker's records as the key ``name + value`` (``__TIMER_SRC<offset>``,
    ``__TRAN_HALF<offset>``): a client's key equal to one would stand among the hits of the
    broker's own look-up (was this delivered, was this committed) and could hide its record."""
    if has_separator(key):
        return SEPARATOR_REASON
    if key.startswith(BROKER_ONLY_KEY_STARTS):
        name = next(n for n in BROKER_ONLY_PROPERTIES if key.startswith(n))
        return (f"may not start with {name} (a broker-only property's name: the index keys "
                "of the broker's own records start with one)")
    return None


def keys_refusal(keys: str) -> str | None:
    """``key_refusal`` of the first refused of a message's KEYS (space-separated: each is an
    index key of its own)."""
    return next((why for why in map(key_refusal, keys.split(KEY_SEPARATOR))
                 if why is not None), None)


def texts_refusal(texts: Iterable[str]) -> str | None:
    """``text_refusal`` of the first refused of ``texts``."""
    return next((why for why in map(text_refusal, texts) if why is not None), None)


def properties_refusal(props: Mapping[str, str]) -> str | None:
    """Why a client's properties map is refused: a separator in a name or a value."""
    for name, value in props.items():
        if has_separator(name) or has_separator(value):
            return f"property {name[:64]!r}: names and values {SEPARATOR_REASON}"
    return uniq_key_refusal(props)


def uniq_key_refusal(props: Mapping[str, str]) -> str | None:
    """Why a client's UNIQ_KEY (its message id, indexed as a key) is refused (``key_refusal``)."""
    uniq = props.get(PROPERTY_UNIQ_KEY)
    why = None if uniq is None else key_refusal(uniq)
    return None if why is None else f"property {PROPERTY_UNIQ_KEY}: {why}"


def broker_only(props: Iterable[str]) -> str | None:
    """The first of the property names ``props`` that only the broker sets, if any."""
    return next((name for name in props if name in BROKER_ONLY_PROPERTIES), None)


def delivery_refusal(real_topic: str, real_queue: str) -> str | None:
    """Why a held record (a delayed or timer message, its ``REAL_TOPIC`` and ``REAL_QID``) may
    not be delivered: into a system topic, or to a queue id that is not one. The broker sets
    both from the send it held, so neither happens but for a record it did not write itself;
    the delivering service skips such a record rather than retry a put that cannot succeed."""
    if is_system_topic(real_topic):
        return f"REAL_TOPIC {real_topic} is a system topic"
    if not (real_queue.isascii() and real_queue.isdigit()) or int(real_queue) > MAX_QUEUE_ID:
        return f"REAL_QID {real_queue[:32]!r} is not a queue id (0 to {MAX_QUEUE_ID})"
    return None


def delivered_here(props: Mapping[str, str]) -> bool:
    """Whether a record carries a delayed delivery's mark (the schedule's or the timer's
    source). One in a system topic other than the timer's own (whose rolls carry it) is a
    client's message delivered there, not the broker's record (``delivery_refusal``)."""
    return SCHEDULE_SOURCE in props or timer.TIMER_SOURCE in props


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


# ---- HTTP (the console) ----------------------------------------------------------------------


def content_length_refusal(value: str | None, max_bytes: int) -> str | None:
    """Why an HTTP body's declared length is refused before any of it is read: none given
    (a body must say how long it is), not a plain decimal (``-1`` reads to the end), or past
    ``max_bytes``."""
    if value is None:
        return "a body needs a Content-Length"
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        return f"Content-Length {value[:32]!r} is not a length"
    if int(text) > max_bytes:
        return f"a body of {int(text)} bytes: at most {max_bytes}"
    return None


def host_name(host: str) -> str:
    """The name in an HTTP ``Host`` value, lower case, without its port or brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def host_refusal(host: str | None, names: frozenset[str]) -> str | None:
    """Why a request whose ``Host`` is ``host`` is refused by a server known as ``names``
    (lower case): a page of another site that rebinds its own name to this address sends that
    name, so only the server's names and IP literals (no DNS, nothing to rebind) pass."""
    if not host:
        return "a request must name its Host"
    name = host_name(host)
    if name in names:
        return None
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return (f"Host {host[:64]!r} is not a name of this server (a DNS-rebinding page "
                "would send its own; give the name with --allow-host)")
    return None
