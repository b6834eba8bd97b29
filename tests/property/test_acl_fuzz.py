"""The ACL parser fuzzed (as tests/property/test_protocol_fuzz.py does the wire codec): any
bytes or any YAML value either parse or raise AclError, nothing else; and a parsed file decides
every (topic, group, permission) as a plain reference model of RocketMQ's rules does."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.format.acl import ANY, DENY, PUB, SUB, AclError, parse_acl

pytestmark = pytest.mark.property

KEYS = [zmq.curve_keypair()[0].decode() for _ in range(4)]
NAMES = ["orders", "audit", "t-1", "%RETRY%g1", "x"]
GROUPS = ["g1", "g2", "billing"]
PERMS = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": ANY}


def parse_or_refuse(data: bytes) -> None:
    try:
        snap = parse_acl(data, "fuzz.yml")
    except AclError as e:
        assert str(e).startswith("fuzz.yml")
        return
    assert snap.accounts and all(a.public_key in snap.by_key for a in snap.accounts)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=2048))
def test_any_bytes_parse_or_are_refused(data: bytes) -> None:
    parse_or_refuse(data)


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=50) | st.sampled_from(KEYS + list(PERMS) + ["orders=PUB", "g=SUB"]),
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.sampled_from(["accounts", "accessKey", "curvePublicKey", "admin",
                                       "replica", "enabled", "topicPerms", "groupPerms",
                                       "defaultTopicPerm", "defaultGroupPerm",
                                       "whiteRemoteAddress", "secretKey", "other"]),
                      inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(yaml_values)
def test_any_yaml_value_parses_or_is_refused(value: Any) -> None:
    parse_or_refuse(yaml.safe_dump({"accounts": value} if not isinstance(value, dict) else value)
                    .encode())


rules = st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(list(PERMS))), max_size=6)
group_rules = st.lists(st.tuples(st.sampled_from(GROUPS), st.sampled_from(list(PERMS))),
                       max_size=4)
accounts = st.fixed_dictionaries(
    {"admin": st.booleans()},
    optional={"defaultTopicPerm": st.sampled_from(list(PERMS)),
              "defaultGroupPerm": st.sampled_from(list(PERMS)),
              "topicPerms": rules, "groupPerms": group_rules})


def reference(spec: dict[str, Any], kind: str, name: str | None, need: int) -> bool:
    """RocketMQ 4's Permission.checkPermission with our strict reading (docs/security.md)."""
    perm_keys = ("defaultTopicPerm", "defaultGroupPerm", "topicPerms", "groupPerms")
    if spec["admin"] and not any(k in spec for k in perm_keys):
        return True
    if kind == "topic" and name is not None and name.startswith("%RETRY%"):
        return reference(spec, "group", name[len("%RETRY%"):], SUB)
    listed = [PERMS[p] for n, p in spec.get(f"{kind}Perms", []) if n == name]
    if listed:
        owned = DENY if any(p & DENY for p in listed) else 0
        for p in listed:
            owned |= p
    else:
        owned = PERMS[spec.get(f"default{kind.capitalize()}Perm", "DENY")]
    return not owned & DENY and owned & need == need


@settings(max_examples=300, deadline=None)
@given(accounts)
def test_decisions_match_the_reference_model(spec: dict[str, Any]) -> None:
    doc = {"accessKey": "a", "curvePublicKey": KEYS[0], "admin": spec["admin"]}
    for key in ("defaultTopicPerm", "defaultGroupPerm"):
        if key in spec:
            doc[key] = spec[key]
    for key in ("topicPerms", "groupPerms"):
        if key in spec:
            doc[key] = [f"{n}={p}" for n, p in spec[key]]
    account = parse_acl(yaml.safe_dump({"accounts": [doc]}).encode(), "m.yml").accounts[0]
    for need in (PUB, SUB):
        for topic in NAMES + ["unlisted"]:
            assert (account.may_topic(topic, need) is None) == \
                reference(spec, "topic", topic, need), (topic, need)
        for group in GROUPS + ["unlisted"]:
            assert (account.may_group(group, need) is None) == \
                reference(spec, "group", group, need), (group, need)
