"""The broker's request processors, one per request code, grouped by family.

A request code's wire contract and its rules (fields, permission, read or write, acked, names a
client topic, served past the in-flight cap) are its row in ``common.format.protocol.SPECS``;
what the broker does with it is its processor here: ``handle(ctx, req) -> Reply | None``
(``context.py``). Adding a request code is its ``RequestCode`` member and its row in ``SPECS``,
and one processor in the family's ``HANDLERS``. ``PROCESSORS`` is every family's, and every
code of ``SPECS`` has one (checked at import).

| module       | codes                                                                  |
|--------------|------------------------------------------------------------------------|
| produce.py   | SEND, SEND_BATCH, CONSUMER_SEND_MSG_BACK, CREATE_TOPIC (to the master)  |
| consume.py   | PULL (long polling), offsets, TOPIC_ROUTE, CONSUMER_HEARTBEAT, GET_CONSUMER_CONNECTION_LIST |
| query.py     | QUERY_BY_KEY, QUERY_BY_MSG_ID, QUERY_BY_OFFSET                         |
| admin.py     | STATUS, CLUSTER_INFO, PROMOTE, CLEAR_ELECTION_FAULT, LOG_CHECKSUM,     |
|              | GET_ALL_*, GET_BROKER_CLUSTER_ACL_INFO, QUERY_GIVEN_UP_TRANSACTIONS,   |
|              | UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, DELETE_SUBSCRIPTIONGROUP          |
| producers.py | GET_PRODUCER_CONNECTION_LIST (live producers, their running info)      |
| pop.py       | POP_MESSAGE (long polling), ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME  |

A code the broker sends to clients (``served_by`` TO_CLIENT in its row) has no processor here:
clients serve it (``Transport.serve``), and the request server refuses it from a client.
"""

from __future__ import annotations

from collections.abc import Callable

from common.broker.processors import admin, consume, pop, produce, producers, query
from common.broker.processors.context import Context
from common.broker.replies import Reply
from common.format.protocol import SPECS, TO_BROKER, Request, RequestCode

Processor = Callable[[Context, Request], "Reply | None"]

PROCESSORS: dict[RequestCode, Processor] = {
    **produce.HANDLERS, **consume.HANDLERS, **query.HANDLERS, **admin.HANDLERS,
    **producers.HANDLERS, **pop.HANDLERS}
assert set(PROCESSORS) == {c for c, s in SPECS.items() if s.served_by == TO_BROKER}, \
    "every request code the broker serves has one processor, and no other code has one"
