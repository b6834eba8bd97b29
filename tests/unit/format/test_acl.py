"""The ACL file and the permission check (common/format/acl.py): RocketMQ ACL 1.0's semantics,
made strict, and the parser's refusals, each naming the file, the account and the field."""

from __future__ import annotations

import pytest
import zmq

from common.format import acl
from common.format.acl import ANY, DENY, PUB, SUB, AclError, parse_acl, rule_for
from common.format.protocol import RequestCode

pytestmark = pytest.mark.unit


def key() -> str:
    return zmq.curve_keypair()[0].decode("ascii")


def snapshot(*accounts: str) -> acl.AclSnapshot:
    return parse_acl(("accounts:\n" + "".join(accounts)).encode(), "acl.yml")


def account(name: str, pub: str | None = None, **fields: object) -> str:
    lines = [f"  - accessKey: {name}\n", f'    curvePublicKey: "{pub or key()}"\n']
    for k, v in fields.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, list):
            v = "[" + ", ".join(str(x) for x in v) + "]"
        lines.append(f"    {k}: {v}\n")
    return "".join(lines)


def only(*fields_lines: str) -> acl.Account:
    return snapshot(*fields_lines).accounts[0]


# ---- semantics ---------------------------------------------------------------------------------


def test_an_explicit_deny_beats_a_pub_sub_default() -> None:
    a = only(account("app", defaultTopicPerm="PUB|SUB", topicPerms=["secret=DENY"]))
    assert a.may_topic("orders", PUB) is None and a.may_topic("orders", SUB) is None
    for need in (PUB, SUB):
        denial = a.may_topic("secret", need)
        assert denial is not None and denial.kind == "deny"
        assert denial.resource == "Topic:secret" and "topicPerms says DENY" in denial.reason


def test_an_explicit_rule_beats_the_default_both_ways() -> None:
    a = only(account("app", defaultTopicPerm="PUB|SUB", topicPerms=["ro=SUB"]))
    denial = a.may_topic("ro", PUB)  # explicit SUB narrows the PUB|SUB default
    assert denial is not None and denial.kind == "no_perm" and "gives SUB" in denial.reason
    b = only(account("app", defaultTopicPerm="DENY", topicPerms=["orders=PUB"]))
    assert b.may_topic("orders", PUB) is None  # explicit PUB opens a DENY default
    assert b.may_topic("other", PUB) is not None


def test_deny_wins_over_a_name_listed_twice() -> None:
    a = only(account("app", topicPerms=["t=PUB|SUB", "t=DENY"], groupPerms=["g=SUB", "g=PUB"]))
    assert a.topics["t"] == DENY
    assert a.groups["g"] == ANY  # no DENY: the union
    assert a.may_topic("t", SUB) is not None


def test_defaults_are_deny_and_sub_only_cannot_send() -> None:
    a = only(account("reader", defaultTopicPerm="SUB", defaultGroupPerm="SUB"))
    assert a.may_topic("orders", SUB) is None
    denial = a.may_topic("orders", PUB)
    assert denial is not None and denial.op == "PUB" and "defaultTopicPerm gives SUB" in \
        denial.reason
    bare = only(account("bare"))
    assert bare.default_topic == DENY and bare.default_group == DENY
    assert bare.may_topic("orders", SUB) is not None and bare.may_group("g") is not None


def test_a_retry_topic_counts_as_its_group() -> None:
    a = only(account("c", defaultTopicPerm="DENY", groupPerms=["billing=SUB"]))
    assert a.may_topic("%RETRY%billing", SUB) is None
    assert a.may_topic("%RETRY%billing", PUB) is None  # a send-back needs SUB on the group
    denial = a.may_topic("%RETRY%other", SUB)
    assert denial is not None and denial.resource == "Group:other"


def test_pull_needs_sub_on_topic_and_group_and_a_missing_group_takes_the_default() -> None:
    a = only(account("c", defaultTopicPerm="SUB", defaultGroupPerm="DENY",
                     groupPerms=["billing=SUB", "blocked=DENY"]))
    pull = rule_for(RequestCode.PULL)
    assert pull(a, {"topic": "t", "group": "billing"}) is None
    denial = pull(a, {"topic": "t", "group": "blocked"})
    assert denial is not None and denial.resource == "Group:blocked" and denial.kind == "deny"
    denial = pull(a, {"topic": "t"})  # leaving the group out is no way around a group rule
    assert denial is not None and "defaultGroupPerm" in denial.reason


def test_admin_and_config_and_unknown_codes() -> None:
    snap = snapshot(account("admin", admin=True), account("app", defaultTopicPerm="PUB|SUB"),
                    account("broker", replica=True))
    admin, app, broker = snap.accounts
    for code in (RequestCode.CREATE_TOPIC, RequestCode.PROMOTE,
                 RequestCode.GET_BROKER_CLUSTER_ACL_INFO):
        assert rule_for(code)(admin, {}) is None
        denial = rule_for(code)(app, {})
        assert denial is not None and denial.op == "ADMIN" and code.name in denial.reason
    for code in (RequestCode.GET_ALL_TOPIC_CONFIG, RequestCode.GET_ALL_CONSUMER_OFFSET,
                 RequestCode.GET_ALL_DELAY_OFFSET):
        assert rule_for(code)(admin, {}) is None and rule_for(code)(broker, {}) is None
        assert rule_for(code)(app, {}) is not None
    unknown = rule_for(9999)
    assert unknown(admin, {}) is None
    denial = unknown(app, {})
    assert denial is not None and denial.kind == "not_admin" and "9999" in denial.reason


def test_every_request_code_is_mapped_explicitly() -> None:
    assert set(acl.REQUEST_RULES) == set(RequestCode)


def test_an_admin_without_perm_keys_has_everything_one_with_them_is_checked() -> None:
    free = only(account("root", admin=True))
    assert free.unrestricted and free.may_topic("anything", PUB) is None
    assert free.may_group("any") is None
    checked = only(account("ops", admin=True, defaultTopicPerm="SUB"))
    assert not checked.unrestricted and checked.may_topic("orders", PUB) is not None


def test_route_send_back_status_and_heartbeat() -> None:
    a = only(account("p", topicPerms=["orders=PUB", "logs=SUB"], groupPerms=["g=SUB"]))
    route = rule_for(RequestCode.TOPIC_ROUTE)
    assert route(a, {"topic": "orders"}) is None and route(a, {"topic": "logs"}) is None
    denial = route(a, {"topic": "other"})
    assert denial is not None and denial.op == "PUB|SUB"
    back = rule_for(RequestCode.CONSUMER_SEND_MSG_BACK)
    assert back(a, {"group": "g", "originTopic": "logs"}) is None
    denial = back(a, {"group": "g", "originTopic": "orders"})  # no SUB on where it came from
    assert denial is not None and denial.resource == "Topic:orders"
    assert rule_for(RequestCode.STATUS)(a, {}) is None
    assert rule_for(RequestCode.CONSUMER_HEARTBEAT)(a, {"group": "g"}) is None
    assert rule_for(RequestCode.CONSUMER_HEARTBEAT)(a, {"group": "h"}) is not None


def test_connect_checks_enabled_and_address_only_as_an_extra_condition() -> None:
    off = only(account("retired", enabled=False, admin=True))
    denial = off.may_connect("127.0.0.1")
    assert denial is not None and denial.kind == "disabled"
    near = only(account("near", whiteRemoteAddress="10.0.1.*", defaultTopicPerm="SUB"))
    assert near.may_connect("10.0.1.9") is None
    denial = near.may_connect("10.0.2.9")
    assert denial is not None and denial.kind == "address" and "10.0.2.9" in denial.reason
    # an allowed address grants nothing by itself: the perms still apply
    assert near.may_topic("orders", PUB) is not None


def test_a_denial_remark_names_account_operation_resource_address_and_reason() -> None:
    a = only(account("app", topicPerms=["t=DENY"]))
    denial = a.may_topic("t", PUB)
    assert denial is not None
    assert denial.remark("10.1.2.3") == \
        "app has no permission to PUB Topic:t from 10.1.2.3: topicPerms says DENY"


@pytest.mark.parametrize(("text", "inside", "outside"), [
    ("*", ["1.2.3.4", "::1"], []),
    ("10.0.1.7", ["10.0.1.7", "::ffff:10.0.1.7"], ["10.0.1.8"]),
    ("10.0.*.*", ["10.0.200.1"], ["10.1.0.1"]),
    ("10.0.1.7-9", ["10.0.1.7", "10.0.1.9"], ["10.0.1.6", "10.0.1.10"]),
    ("10.0.1.{3,5}", ["10.0.1.3", "10.0.1.5"], ["10.0.1.4"]),
    ("172.16.0.0/12, 192.168.0.1", ["172.31.9.9", "192.168.0.1"], ["172.32.0.1"]),
    ("fd00::/8", ["fd12::1"], ["fe80::1", "10.0.0.1"]),
])
def test_white_remote_address_forms(text: str, inside: list[str], outside: list[str]) -> None:
    rule = acl.parse_addresses(text, "w")
    assert rule is not None
    assert all(rule.allows(ip) for ip in inside)
    assert not any(rule.allows(ip) for ip in outside)
    assert not rule.allows("not-an-ip") or rule.any_address


@pytest.mark.parametrize("text", ["10.0.1", "10.*.1.1", "300.0.0.1", "10.0.1.9-7", "1.2.3.{}",
                                  "10.0.0.0/40", "a.b.c.d", "*.1.1.1"])
def test_bad_addresses_are_refused(text: str) -> None:
    with pytest.raises(AclError, match="whiteRemoteAddress"):
        snapshot(account("a", whiteRemoteAddress=f'"{text}"'))


# ---- the parser's refusals -----------------------------------------------------------------------


@pytest.mark.parametrize(("body", "message"), [
    ("accounts: []\n", "non-empty list"),
    ("- a\n", "must be a mapping"),
    ("accounts:\n  - accessKey: x\n    curvePublicKey: short\n", "40 Z85"),
    ("accounts: [\n", "not YAML"),
    ("globalWhiteRemoteAddresses: ['*']\naccounts: []\n", "never admit anyone"),
    ("other: 1\n", "unknown key 'other'"),
])
def test_file_level_refusals(body: str, message: str) -> None:
    with pytest.raises(AclError, match=message) as info:
        parse_acl(body.encode(), "conf/acl.yml")
    assert str(info.value).startswith("conf/acl.yml")


@pytest.mark.parametrize(("fields", "message"), [
    ({"secretKey": "s3cr3t"}, "secretKey must be 16 to 255 printable characters"),
    ({"secretKey": '"sixteen chars but spaces"'}, "without spaces"),
    ({"admni": True}, "unknown key 'admni'"),
    ({"admin": '"yes"'}, "admin must be true or false"),
    ({"defaultTopicPerm": "PUBB"}, "not a permission"),
    ({"topicPerms": ["orders=PUB|SUBX"]}, r"topicPerms\[0\]"),
    ({"topicPerms": ["orders"]}, "not name=PERM"),
    ({"groupPerms": ['"bad name=SUB"']}, "not a topic or group name"),
    ({"topicPerms": '"orders=PUB"'}, "must be a list"),
])
def test_account_level_refusals_name_the_account_and_field(fields: dict[str, object],
                                                            message: str) -> None:
    with pytest.raises(AclError, match=message) as info:
        snapshot(account("good"), account("broken", **fields))
    assert "accounts[1] (broken)" in str(info.value)


def test_duplicate_names_and_keys_are_refused() -> None:
    pub = key()
    with pytest.raises(AclError, match="accessKey 'a' is also accounts\\[0\\]'s"):
        snapshot(account("a"), account("a"))
    with pytest.raises(AclError, match="also account a's"):
        snapshot(account("a", pub), account("b", pub))


def test_limits_are_checked_before_the_work() -> None:
    with pytest.raises(AclError, match="at most"):
        parse_acl(b"#" * (acl.MAX_ACL_BYTES + 1), "big.yml")
    half = ", ".join(f"t{i}=SUB" for i in range(acl.MAX_RULES // 2 + 1))
    with pytest.raises(AclError, match="more than"):  # counted over the whole file
        snapshot(account("a", topicPerms=[half]), account("b", groupPerms=[half]))


def test_the_snapshot_knows_its_digest_and_keys() -> None:
    pub = key()
    data = ("accounts:\n" + account("a", pub)).encode()
    snap = parse_acl(data, "f", version=7)
    assert snap.version == 7 and snap.account(pub) is snap.accounts[0]
    assert snap.account(key()) is None
    import hashlib

    assert snap.digest == hashlib.sha256(data).hexdigest()
