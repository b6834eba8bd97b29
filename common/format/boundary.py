"""The one trust boundary: what a client may put in a message and in a request.

Every entry path (the client port's requests, in-process calls, the gRPC front end, the
console) holds what a client sends to these rules before it reaches a processor or the store;
the C paths enforce the same rules and tests hold them to these. Each rule answers with the
reason a value is refused, or None: the caller turns a reason into its own refusal.
``docs/security.md`` lists every entry path, what it checks here, and the test that holds it.
"""

from __future__ import annotations

import ipaddress

from common.core import timer, transaction
from common.core.message import NAME_VALUE_SEP, PROPERTY_SEP, is_system_topic
from common.core.pop import POP_RECORD

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
