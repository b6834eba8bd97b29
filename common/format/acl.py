"""The ACL file and the permission check: pure functions over an immutable snapshot.

The file is RocketMQ ACL 1.0's ``plain_acl.yml`` (``docs/security.md``), with a CURVE public key
beside RocketMQ's ``secretKey``, and two keys of ours, ``replica`` and ``enabled``::

    accounts:
      - accessKey: orders-app               # the account's name (audit lines, remarks)
        curvePublicKey: "<40 Z85 chars>"    # its .key file's public-key; the identity
        secretKey: "<16+ characters>"       # the gRPC front end's ACL 2.0 signatures
        whiteRemoteAddress: 10.0.1.*        # optional: ALSO required, never a bypass
        admin: false                        # topic/group changes, promote, config, the ACL
        replica: false                      # may connect to the HA port as a slave
        brokerIds: [1, 2]                   # replica: the member ids it may replicate as
        enabled: true                       # false: refused at the handshake and per request
        defaultTopicPerm: DENY              # DENY | PUB | SUB | PUB|SUB (default DENY)
        defaultGroupPerm: SUB               # (default DENY)
        topicPerms: [orders=PUB|SUB, audit=DENY]
        groupPerms: [billing=SUB]

Semantics (RocketMQ's ``Permission.checkPermission``, made strict):

* a topic or group named in ``topicPerms``/``groupPerms`` takes that rule; any other takes the
  default (an explicit rule beats the default, also an explicit SUB under a default PUB|SUB);
  a rule holding DENY refuses, and a name listed twice with DENY in one entry is DENY (DENY
  always wins);
* a retry topic ``%RETRY%G`` counts as the group G (SUB on G), as in RocketMQ;
* an admin account that sets none of the four perm keys may PUB and SUB everything (RocketMQ's
  rule); an admin account that sets any of them is checked like any other;
* an unknown or unmapped operation needs admin;
* ``whiteRemoteAddress`` is one more condition on every request and handshake of the account
  (RocketMQ lets a matching address skip the signature and the permission check; we do not),
  and ``globalWhiteRemoteAddresses`` is refused.

``parse_acl`` refuses anything else with an ``AclError`` naming the file, the account and the
field; limits on size and counts are checked before the work they bound. ``REQUEST_RULES`` maps
every ``RequestCode`` to the check of its ``Permission`` (its row in
``common.format.protocol.SPECS``); ``rule_for`` gives the admin check for a code missing from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from common.core.keys import KeyFileError, check_public_key, fingerprint
from common.core.message import RETRY_PREFIX
from common.format.protocol import SPECS, TOPIC_PATTERN, Permission, RequestCode

DENY, PUB, SUB = 1, 2, 4  # RocketMQ's Permission bits
ANY = PUB | SUB
PERM_NAMES = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": ANY, "SUB|PUB": ANY}
MAX_ACL_BYTES = 4 * 1024 * 1024
MAX_ACCOUNTS = 10_000
MAX_RULES = 200_000  # topicPerms + groupPerms entries of all accounts together
MAX_NAME_LENGTH = 255
MAX_ADDRESS_ENTRIES = 256

ACCOUNT_KEYS = ("accessKey", "curvePublicKey", "secretKey", "whiteRemoteAddress", "admin", "replica",
                "brokerIds", "enabled", "defaultTopicPerm", "defaultGroupPerm", "topicPerms",
                "groupPerms")
_PERM_KEYS = ("defaultTopicPerm", "defaultGroupPerm", "topicPerms", "groupPerms")
_ACCESS_KEY = re.compile(r"^[A-Za-z0-9._@-]{1,255}\Z")
MIN_SECRET_LENGTH = 16  # RocketMQ asks 6; a secret signs every gRPC call of its account
_SECRET_KEY = re.compile(rf"^[\x21-\x7e]{{{MIN_SECRET_LENGTH},255}}\Z")
_REFUSED_KEYS = {
    "globalWhiteRemoteAddresses": "an address may only add a condition to an account "
                                  "(whiteRemoteAddress), never admit anyone by itself",
}


class AclError(ValueError):
    """An ACL file that cannot be used; the message names the file, account and field."""


# ---- addresses -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AddressRule:
    """RocketMQ's ``whiteRemoteAddress`` forms, comma-separated: ``*``, an address (IPv4 or
    IPv6), ``10.1.*.*`` (trailing ``*``), ``10.1.2.7-9`` and ``10.1.2.{7,9}`` (last octet),
    and CIDR ``10.0.0.0/8``."""

    text: str
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    any_address: bool = False

    def allows(self, address: str) -> bool:
        if self.any_address:
            return True
        try:
            ip = ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in net for net in self.networks)


def parse_addresses(text: Any, where: str) -> AddressRule | None:
    """``whiteRemoteAddress`` -> AddressRule (None when absent or empty: no condition)."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise AclError(f"{where}: expected a string like 10.0.1.* or 10.0.0.0/8, got "
                       f"{type(text).__name__}")
    entries = [e.strip() for e in _split_outside_braces(text) if e.strip()]
    if not entries:
        return None
    if len(entries) > MAX_ADDRESS_ENTRIES:
        raise AclError(f"{where}: {len(entries)} entries, at most {MAX_ADDRESS_ENTRIES}")
    networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for entry in entries:
        if entry in ("*", "*.*.*.*"):
            return AddressRule(text, (), any_address=True)
        networks.extend(_networks(entry, where))
    return AddressRule(text, tuple(networks))


def _split_outside_braces(text: str) -> list[str]:
    """``a, b.c.d.{1,2}`` -> ``["a", " b.c.d.{1,2}"]``: the commas of a ``{x,y}`` stay."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _networks(entry: str, where: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    bad = AclError(f"{where}: {entry!r} is not an address, a.b.*.*, a.b.c.x-y, a.b.c.{{x,y}} "
                   "or a CIDR network")
    if "/" in entry or ":" in entry:
        try:
            return [ipaddress.ip_network(entry, strict=False)]
        except ValueError:
            raise bad from None
    octets = entry.split(".")
    if len(octets) != 4:
        raise bad
    stars = 0
    while stars < 4 and octets[3 - stars] == "*":
        stars += 1
    head = octets[: 4 - stars]
    if stars == 0 and ("-" in head[3] or head[3].startswith("{")):
        if not _octets_ok(head[:3]):
            raise bad
        prefix = ".".join(head[:3])
        return [ipaddress.ip_network(f"{prefix}.{n}/32") for n in _last_octets(head[3], bad)]
    if stars == 4 or not _octets_ok(head):
        raise bad
    base = ".".join(head + ["0"] * stars)
    return [ipaddress.ip_network(f"{base}/{32 - 8 * stars}")]


def _octets_ok(octets: list[str]) -> bool:
    return all(o.isdigit() and len(o) <= 3 and int(o) <= 255 for o in octets)


def _last_octets(text: str, bad: AclError) -> list[int]:
    if text.startswith("{") and text.endswith("}"):
        items = [t.strip() for t in text[1:-1].split(",")]
        if not items or not _octets_ok(items):
            raise bad
        return sorted({int(t) for t in items})
    lo, sep, hi = text.partition("-")
    if not sep or not _octets_ok([lo, hi]) or int(lo) > int(hi):
        raise bad
    return list(range(int(lo), int(hi) + 1))


# ---- accounts and the snapshot --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Denial:
    """Why a request (or a handshake) is refused: who, what operation on what, and why."""

    account: str  # accessKey, or "unknown" for a key the ACL does not hold
    op: str  # PUB, SUB, PUB|SUB, ADMIN, REPLICATE, CONNECT
    resource: str  # Topic:x, Group:y, Cluster
    reason: str
    kind: str  # a bounded label for metrics: unknown_key, disabled, address, deny, no_perm...

    def remark(self, address: str) -> str:
        where = f" from {address}" if address else ""
        return (f"{self.account} has no permission to {self.op} {self.resource}{where}: "
                f"{self.reason}")


@dataclasses.dataclass(frozen=True, eq=False)
class Account:
    """One ACL account, ready for O(1) checks."""

    access_key: str
    public_key: str | None  # Z85 (None: an account of the gRPC front end only)
    admin: bool = False
    replica: bool = False
    enabled: bool = True
    default_topic: int = DENY
    default_group: int = DENY
    topics: Mapping[str, int] = dataclasses.field(default_factory=dict)
    groups: Mapping[str, int] = dataclasses.field(default_factory=dict)
    addresses: AddressRule | None = None
    unrestricted: bool = False  # an admin account that sets no perm key at all
    broker_ids: frozenset[int] | None = None  # replica: the member ids it may be (None: any)
    # RocketMQ's secretKey: the gRPC front end checks the account's ACL 2.0 signatures with it
    # (None: the account cannot use gRPC). Never printed.
    secret_key: str | None = dataclasses.field(default=None, repr=False)

    # -- resource checks: None when allowed --------------------------------------------------
    def may_topic(self, topic: str, need: int) -> Denial | None:
        if self.unrestricted:
            return None
        if topic.startswith(RETRY_PREFIX):  # %RETRY%G is the group G's (RocketMQ)
            return self.may_group(topic[len(RETRY_PREFIX):], SUB)
        perm = self.topics.get(topic)
        if perm is None:
            perm = self.default_topic
            if perm & need == need and not perm & DENY:
                return None
            return self._refused(need, f"Topic:{topic}", perm, "defaultTopicPerm")
        if perm & need == need and not perm & DENY:
            return None
        return self._refused(need, f"Topic:{topic}", perm, "topicPerms")

    def may_group(self, group: str | None, need: int = SUB) -> Denial | None:
        if self.unrestricted:
            return None
        perm = self.groups.get(group) if group else None
        if perm is None:
            perm = self.default_group
            if perm & need == need and not perm & DENY:
                return None
            name = f"Group:{group}" if group else "Group:(none named)"
            return self._refused(need, name, perm, "defaultGroupPerm")
        if perm & need == need and not perm & DENY:
            return None
        return self._refused(need, f"Group:{group}", perm, "groupPerms")

    def may_topic_either(self, topic: str) -> Denial | None:
        """PUB or SUB (a topic's route: producers and consumers both ask)."""
        if self.may_topic(topic, PUB) is None or self.may_topic(topic, SUB) is None:
            return None
        denial = self.may_topic(topic, SUB)
        assert denial is not None
        return dataclasses.replace(denial, op="PUB|SUB")

    def may_admin(self, what: str) -> Denial | None:
        if self.admin:
            return None
        return Denial(self.access_key, "ADMIN", "Cluster", f"{what} needs an admin account",
                      "not_admin")

    def may_read_config(self, what: str) -> Denial | None:
        """The tables a slave copies (GET_ALL_*): admin, or a replica (it holds the log)."""
        if self.admin or self.replica:
            return None
        return Denial(self.access_key, "ADMIN", "Cluster",
                      f"{what} needs an admin or replica account", "not_admin")

    def may_replicate(self) -> Denial | None:
        if self.replica:
            return None
        return Denial(self.access_key, "REPLICATE", "Cluster",
                      "the HA port admits replica accounts only", "not_replica")

    def may_be_member(self, broker_id: int) -> Denial | None:
        """A replica account replicating as member ``broker_id`` (its HELLO's brokerId)."""
        if self.broker_ids is None or broker_id in self.broker_ids:
            return None
        return Denial(self.access_key, "REPLICATE", f"Member:{broker_id}",
                      f"brokerIds {sorted(self.broker_ids)} does not name member {broker_id}",
                      "not_this_member")

    def may_connect(self, address: str) -> Denial | None:
        """Enabled, and from an allowed address (every handshake and request)."""
        if not self.enabled:
            return Denial(self.access_key, "CONNECT", "Cluster", "the account is disabled "
                          "(enabled: false)", "disabled")
        if self.addresses is not None and not self.addresses.allows(address):
            return Denial(self.access_key, "CONNECT", "Cluster", f"address {address or '?'} "
                          f"is not in whiteRemoteAddress {self.addresses.text}", "address")
        return None

    def _refused(self, need: int, resource: str, owned: int, source: str) -> Denial:
        op = perm_name(need)
        if owned & DENY:
            return Denial(self.access_key, op, resource, f"{source} says DENY", "deny")
        return Denial(self.access_key, op, resource,
                      f"{source} gives {perm_name(owned) or 'nothing'}", "no_perm")


def perm_name(perm: int) -> str:
    if perm & DENY:
        return "DENY"
    return {PUB: "PUB", SUB: "SUB", ANY: "PUB|SUB"}.get(perm & ANY, "")


def unknown_key(public_key: str) -> Denial:
    return Denial("unknown", "CONNECT", "Cluster",
                  f"key {fingerprint(public_key)} is in no account of the ACL", "unknown_key")


@dataclasses.dataclass(frozen=True)
class AclSnapshot:
    """One parsed ACL file; never changed (a reload builds a new one and swaps it in)."""

    accounts: tuple[Account, ...]
    by_key: Mapping[str, Account]  # Z85 public key (ZAP's User-Id) -> account
    digest: str  # sha256 of the file's bytes
    source: str
    version: int = 0  # 1 for the first file loaded, +1 per reload that changed it
    by_access_key: Mapping[str, Account] = dataclasses.field(default_factory=dict)

    def account(self, public_key: str) -> Account | None:
        return self.by_key.get(public_key)

    @property
    def has_secrets(self) -> bool:
        """Some account has a secretKey: the file must be readable by its owner only."""
        return any(a.secret_key is not None for a in self.accounts)


# ---- parsing ---------------------------------------------------------------------------------


def parse_acl(data: bytes, source: str, version: int = 1) -> AclSnapshot:
    """The bytes of an ACL file -> AclSnapshot; AclError naming what is wrong."""
    if len(data) > MAX_ACL_BYTES:
        raise AclError(f"{source}: {len(data)} bytes, at most {MAX_ACL_BYTES}")
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as e:
        raise AclError(f"{source}: not YAML: {e}") from None
    except (UnicodeDecodeError, RecursionError) as e:
        raise AclError(f"{source}: not readable YAML: {e}") from None
    if not isinstance(doc, dict):
        raise AclError(f"{source}: must be a mapping with an 'accounts' list (got "
                       f"{type(doc).__name__})")
    for key in doc:
        if key in _REFUSED_KEYS:
            raise AclError(f"{source}: {key} is not supported: {_REFUSED_KEYS[key]}")
        if key != "accounts":
            raise AclError(f"{source}: unknown key {key!r} (the file holds 'accounts')")
    raw_accounts = doc.get("accounts")
    if not isinstance(raw_accounts, list) or not raw_accounts:
        raise AclError(f"{source}: 'accounts' must be a non-empty list (an ACL that admits "
                       "nobody is refused; set enabled: false on an account to lock it out)")
    if len(raw_accounts) > MAX_ACCOUNTS:
        raise AclError(f"{source}: {len(raw_accounts)} accounts, at most {MAX_ACCOUNTS}")
    budget = [MAX_RULES]
    accounts = [_account(raw, f"{source}: accounts[{i}]", budget)
                for i, raw in enumerate(raw_accounts)]
    by_key: dict[str, Account] = {}
    names: dict[str, int] = {}
    for i, acct in enumerate(accounts):
        if acct.access_key in names:
            raise AclError(f"{source}: accounts[{i}]: accessKey {acct.access_key!r} is also "
                           f"accounts[{names[acct.access_key]}]'s")
        names[acct.access_key] = i
        if acct.public_key is None:
            continue
        if acct.public_key in by_key:
            raise AclError(f"{source}: accounts[{i}] ({acct.access_key}): its curvePublicKey "
                           f"is also account {by_key[acct.public_key].access_key}'s (a key "
                           "names one account)")
        by_key[acct.public_key] = acct
    return AclSnapshot(tuple(accounts), by_key, hashlib.sha256(data).hexdigest(), source,
                       version, {a.access_key: a for a in accounts})


def _account(raw: Any, where: str, budget: list[int]) -> Account:
    if not isinstance(raw, dict):
        raise AclError(f"{where}: must be a mapping (accessKey, curvePublicKey, ...)")
    name = raw.get("accessKey")
    if not isinstance(name, str) or not _ACCESS_KEY.match(name):
        raise AclError(f"{where}: accessKey must be 1-255 letters, digits, '.', '_', '@' "
                       f"or '-' (got {name!r})")
    where = f"{where} ({name})"
    for key in raw:
        if key in _REFUSED_KEYS:
            raise AclError(f"{where}: {key} is not supported: {_REFUSED_KEYS[key]}")
        if key not in ACCOUNT_KEYS:
            raise AclError(f"{where}: unknown key {key!r} (known: {', '.join(ACCOUNT_KEYS)})")
    key = raw.get("curvePublicKey")
    secret = raw.get("secretKey")
    if secret is not None and (not isinstance(secret, str) or not _SECRET_KEY.match(secret)):
        raise AclError(f"{where}: secretKey must be {MIN_SECRET_LENGTH} to 255 printable "
                       "characters without spaces (e.g. the output of python -c \"import "
                       "secrets; print(secrets.token_urlsafe(24))\")")
    if key is None and secret is None:
        raise AclError(f"{where}: give a curvePublicKey (the 40-character Z85 public key of "
                       "the account's .key file), a secretKey (gRPC's signatures), or both")
    if key is not None:
        if not isinstance(key, str):
            raise AclError(f"{where}: curvePublicKey must be the 40-character Z85 public key "
                           "of the account's .key file")
        try:
            check_public_key(key, f"{where}: curvePublicKey")
        except KeyFileError as e:
            raise AclError(str(e)) from None
    flags = {k: _flag(raw, k, default, where)
             for k, default in (("admin", False), ("replica", False), ("enabled", True))}
    topics = _rules(raw.get("topicPerms"), f"{where}: topicPerms", budget)
    groups = _rules(raw.get("groupPerms"), f"{where}: groupPerms", budget)
    return Account(
        access_key=name,
        public_key=key,
        admin=flags["admin"],
        replica=flags["replica"],
        enabled=flags["enabled"],
        default_topic=_perm(raw.get("defaultTopicPerm", "DENY"), f"{where}: defaultTopicPerm"),
        default_group=_perm(raw.get("defaultGroupPerm", "DENY"), f"{where}: defaultGroupPerm"),
        topics=topics,
        groups=groups,
        addresses=parse_addresses(raw.get("whiteRemoteAddress"),
                                  f"{where}: whiteRemoteAddress"),
        unrestricted=flags["admin"] and not any(k in raw for k in _PERM_KEYS),
        broker_ids=_broker_ids(raw.get("brokerIds"), f"{where}: brokerIds"),
        secret_key=secret,
    )


def _broker_ids(value: Any, where: str) -> frozenset[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or len(value) > 255 or any(
            not isinstance(i, int) or isinstance(i, bool) or not 1 <= i <= 255 for i in value):
        raise AclError(f"{where}: must be a list of member ids 1..255 (got {value!r})")
    return frozenset(value)


def _flag(raw: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise AclError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _perm(value: Any, where: str) -> int:
    if isinstance(value, str):
        perm = PERM_NAMES.get(value.strip().upper().replace(" ", ""))
        if perm is not None:
            return perm
    raise AclError(f"{where}: {value!r} is not a permission (DENY, PUB, SUB or PUB|SUB)")


def _rules(value: Any, where: str, budget: list[int]) -> dict[str, int]:
    """``[name=PERM, ...]`` -> name -> perm; a name listed twice: DENY wins, else the union."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise AclError(f"{where}: must be a list of name=PERM strings")
    budget[0] -= len(value)
    if budget[0] < 0:
        raise AclError(f"{where}: more than {MAX_RULES} topicPerms and groupPerms entries in "
                       "the file")
    out: dict[str, int] = {}
    for i, item in enumerate(value):
        entry = f"{where}[{i}]"
        if not isinstance(item, str) or "=" not in item:
            raise AclError(f"{entry}: {item!r} is not name=PERM (e.g. orders=PUB|SUB)")
        name, _, perm_text = item.partition("=")
        name = name.strip()
        if not 0 < len(name) <= MAX_NAME_LENGTH or not TOPIC_PATTERN.match(name):
            raise AclError(f"{entry}: {name!r} is not a topic or group name (letters, digits, "
                           "'%', '|', '_', '-')")
        perm = _perm(perm_text, f"{entry} {name}")
        before = out.get(name, 0)
        out[name] = DENY if (perm | before) & DENY else perm | before
    return out


# ---- what each request needs -----------------------------------------------------------------

Rule = Callable[[Account, Mapping[str, Any]], "Denial | None"]


def _rule(code: RequestCode, need: Permission) -> Rule:
    """The check of a request's ``Permission`` (its row in ``common.format.protocol.SPECS``)."""
    if need.anyone or need.found:
        # anyone: STATUS and the routes, what every client needs to find the master; found:
        # a look-up by msgId or offset, checked on the topic of the message found (server)
        return lambda a, f: None
    if need.admin:
        return lambda a, f: a.may_admin(code.name)
    if need.config:
        return lambda a, f: a.may_read_config(code.name)

    def check(a: Account, f: Mapping[str, Any]) -> Denial | None:
        if need.topic == "PUB|SUB":
            denial = a.may_topic_either(f["topic"])
        elif need.topic:
            denial = a.may_topic(f["topic"], PUB if need.topic == "PUB" else SUB)
        else:
            denial = None
        if denial is None and need.group:
            # a request that names no group is judged by defaultGroupPerm (no bypass by
            # leaving it out)
            denial = a.may_group(f.get("group"), SUB)
        if denial is None and need.origin_topic:
            denial = a.may_topic(f["originTopic"], SUB)
        return denial

    return check


REQUEST_RULES: dict[RequestCode, Rule] = {code: _rule(code, spec.permission)
                                         for code, spec in SPECS.items()}


def rule_for(code: int) -> Rule:
    """The check of a request code; a code without one (unknown, or added to RequestCode and
    not mapped here) needs admin."""
    rule = REQUEST_RULES.get(code)  # type: ignore[call-overload]
    if rule is not None:
        return rule
    name = code.name if isinstance(code, RequestCode) else f"request code {code}"
    return lambda a, f: a.may_admin(f"{name} (not mapped to an operation)")


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
