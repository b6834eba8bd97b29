"""Who calls the gRPC front end, and what each call may do (with ``aclEnable``).

Authentication is RocketMQ ACL 2.0's, as every official client signs a call: the metadata
``authorization`` holds ``MQv2-HMAC-SHA1 Credential=<accessKey>, SignedHeaders=x-mq-date-time,
Signature=<hex>``, where the signature is HMAC-SHA1 of the ``x-mq-date-time`` value keyed by
the account's ``secretKey`` (ACL file, ``common/format/acl.py``). It is compared in constant
time. The signature covers only that time, which the clients write in their local zone with a
``Z``: it is not checked against a clock (RocketMQ's proxy does not either), so what keeps a
captured header from being used again is TLS, which the front end always runs with
``aclEnable``.

Authorization is replog's ACL, per call, on the snapshot in force *now* (a revoked account is
refused on the next call of a channel already open): ``needs`` of each RPC name the topic and
group permissions it takes, RocketMQ's rules for the proxy: a route needs PUB or SUB on the
topic; a send, a recall and a transaction's end PUB on the topic (the one its id names); a
receive, ack, change of invisibility and forward to the DLQ SUB on the topic (each receipt
handle's own) and on the group; a heartbeat or termination naming a group, SUB on it; the
telemetry settings PUB on each topic published and SUB on each subscribed and the group.

A refusal is audited (``refused(port, address, key, denial, version)``, the broker's audit
line and counter under port ``grpc``) and answered in the response's status:
``UNAUTHORIZED`` (40100) when the caller is not an account, ``FORBIDDEN`` (40300) when the
account may not, as RocketMQ's proxy answers them.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Sequence
from hashlib import sha1
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from common.format.acl import PUB, SUB, Account, AclSnapshot, Denial

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
PORT = "grpc"
MAX_HEADER = 1024  # an authorization value longer than this is not a signature

# (kind, name, perm): kind "topic" (perm PUB or SUB, or PUB|SUB for either), "group"
Need = tuple[str, str, int]
Refused = Callable[[str, str, str, Denial, int], None]


def sign(secret_key: str, date_time: str) -> str:
    """The signature a client sends for ``date_time`` (hex HMAC-SHA1)."""
    return hmac.new(secret_key.encode(), date_time.encode(), sha1).hexdigest()


def parse_authorization(value: str) -> tuple[str, str]:
    """``MQv2-HMAC-SHA1 Credential=AK[/...], SignedHeaders=..., Signature=HEX`` -> (access
    key, signature); ValueError naming what is wrong."""
    if len(value) > MAX_HEADER:
        raise ValueError(f"authorization of {len(value)} characters")
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm.upper() != ALGORITHM.upper():
        raise ValueError(f"algorithm {algorithm[:40]!r}: only {ALGORITHM} is served")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, text = part.strip().partition("=")
        if sep:
            fields[name.strip()] = text.strip()
    credential, signature = fields.get("Credential", ""), fields.get("Signature", "")
    signed = [h.strip().lower() for h in fields.get("SignedHeaders", "").split(";")]
    access_key = credential.split("/", 1)[0]
    if not access_key or not signature:
        raise ValueError("no Credential or no Signature")
    if DATE_HEADER not in signed:
        raise ValueError(f"SignedHeaders must name {DATE_HEADER}")
    return access_key, signature


def peer_address(peer: str) -> str:
    """grpc's ``context.peer()`` (``ipv4:10.0.0.7:5123``, ``ipv6:[::1]:5123``) -> the address."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return ""


class GrpcAuth:
    """The checks of one front end over the ACL snapshot ``current()`` returns."""

    def __init__(self, current: Callable[[], AclSnapshot], refused: Refused):
        self.current = current
        self.refused = refused

    def authenticate(self, metadata: Sequence[tuple[str, Any]],
                     address: str) -> Account | Denial:
        """The account whose secretKey signed the call, enabled and at an allowed address."""
        headers = {k.lower(): v for k, v in metadata if isinstance(v, str)}
        value, date_time = headers.get("authorization"), headers.get(DATE_HEADER, "")
        if value is None:
            return Denial("unknown", "CONNECT", "Cluster", "the call is not signed (no "
                          "authorization metadata: give the client an access key and secret "
                          "key)", "unsigned")
        try:
            access_key, signature = parse_authorization(value)
        except ValueError as e:
            return Denial("unknown", "CONNECT", "Cluster", f"authorization: {e}", "bad_header")
        acct = self.current().by_access_key.get(access_key)
        if acct is None or acct.secret_key is None:
            why = ("is in no account of the ACL" if acct is None else
                   "has no secretKey in the ACL (it may not use gRPC)")
            return Denial("unknown" if acct is None else access_key, "CONNECT", "Cluster",
                          f"access key {access_key[:64]!r} {why}", "unknown_key")
        if not date_time or not hmac.compare_digest(sign(acct.secret_key, date_time),
                                                    signature.lower()):
            return Denial(access_key, "CONNECT", "Cluster", "the signature does not match "
                          "the account's secretKey", "bad_signature")
        denial = acct.may_connect(address)
        return acct if denial is None else denial

    def check(self, context: Any, needs: Iterable[Need]) -> pb.Status | None:
        """None when the call may go on; else the status to answer (the refusal audited)."""
        address = peer_address(context.peer() or "")
        metadata = context.invocation_metadata() or ()
        who = self.authenticate(metadata, address)
        if isinstance(who, Denial):
            return self._refuse(pb.UNAUTHORIZED, who, address)
        for kind, name, perm in needs:
            if kind == "group":
                denial = who.may_group(name, SUB)
            elif perm == PUB | SUB:
                denial = who.may_topic_either(name)
            else:
                denial = who.may_topic(name, perm)
            if denial is not None:
                return self._refuse(pb.FORBIDDEN, denial, address)
        return None

    def _refuse(self, code: int, denial: Denial, address: str) -> pb.Status:
        key = denial.account if denial.account != "unknown" else address
        self.refused(PORT, address, key, denial, self.current().version)
        return pb.Status(code=code, message=denial.remark(address))  # type: ignore[arg-type]
