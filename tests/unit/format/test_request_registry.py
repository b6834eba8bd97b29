"""The request table: every code has one row (``common.format.protocol.SPECS``) and one
processor (``common.broker.processors.PROCESSORS``), and the rules the server, the codec and the
ACL apply come from the row."""

from __future__ import annotations

import pytest

from common.broker import server
from common.broker.processors import PROCESSORS
from common.format import acl
from common.format.protocol import (
    BODY_COUNTS,
    SCHEMAS,
    SPECS,
    TO_BROKER,
    TO_CLIENT,
    WRITE,
    WRITE_CODES,
    RequestCode,
)

pytestmark = pytest.mark.unit

# a POP writes a revive record (a master's), answered once it is durable
POP_CODES = (RequestCode.POP_MESSAGE, RequestCode.ACK_MESSAGE, RequestCode.BATCH_ACK_MESSAGE,
             RequestCode.CHANGE_MESSAGE_INVISIBLETIME)


def test_every_code_has_one_row_and_one_processor() -> None:
    """Every code has a row and an ACL rule; every code the broker serves has one processor,
    and a code it sends to clients (served by them) has none."""
    assert set(SPECS) == set(RequestCode) == set(acl.REQUEST_RULES)
    assert set(PROCESSORS) == {c for c, s in SPECS.items() if s.served_by == TO_BROKER}
    assert {c for c, s in SPECS.items() if s.served_by == TO_CLIENT} == {
        RequestCode.GET_CLIENT_RUNNING_INFO, RequestCode.CHECK_TRANSACTION_STATE}
    assert server._CLIENT_SERVED == {RequestCode.GET_CLIENT_RUNNING_INFO,
                                     RequestCode.CHECK_TRANSACTION_STATE}


def test_the_server_the_codec_and_the_acl_read_the_rows() -> None:
    assert WRITE_CODES == {c for c, s in SPECS.items() if s.kind == WRITE} == {
        RequestCode.SEND, RequestCode.SEND_BATCH, RequestCode.CREATE_TOPIC,
        RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.RECALL_MESSAGE,
        RequestCode.END_TRANSACTION, *POP_CODES,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.DELETE_SUBSCRIPTIONGROUP}
    assert server._ACKED_WRITES == {RequestCode.SEND, RequestCode.SEND_BATCH,
                                    RequestCode.CONSUMER_SEND_MSG_BACK,
                                    RequestCode.RECALL_MESSAGE, RequestCode.END_TRANSACTION,
                                    *POP_CODES}
    assert server._ALWAYS_SERVED == {RequestCode.STATUS, RequestCode.CLUSTER_INFO}
    assert RequestCode.PULL in server._NAMES_TOPIC and RequestCode.STATUS not in server._NAMES_TOPIC
    assert SCHEMAS[RequestCode.PULL] is SPECS[RequestCode.PULL].fields
    assert BODY_COUNTS[RequestCode.SEND] == (1, 1)
    assert server._PEER == server._WRITES | {RequestCode.PRODUCER_HEARTBEAT}
    admin = acl.Account("a", "k", admin=True)
    app = acl.Account("b", "k", default_topic=acl.ANY, default_group=acl.SUB)
    for code, spec in SPECS.items():
        if spec.permission.admin:
            assert acl.rule_for(code)(admin, {}) is None
            denial = acl.rule_for(code)(app, {})
            assert denial is not None and code.name in denial.reason
