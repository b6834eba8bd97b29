"""RocketMQ 5's gRPC protocol with ``aclEnable`` (issue 41, item 5): the port runs TLS only;
every call is signed the way ACL 2.0's clients sign it (access key and secret key), mapped onto
replog's ACL accounts; no account reaches what its permissions deny; the official Python client
works unchanged with ``Credentials(ak, sk)`` and ``tls_enable=True``.

The certificate is made once per session and handed to gRPC as its default roots
(``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``, read once per process when the first TLS channel is
made): the client trusts it as a CA-signed certificate, for 127.0.0.1."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers.brokers import addr, free_port
from helpers.children import replog_child
from helpers.tls import make_certificate
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message
from rocketmq import Producer as OfficialProducer
from rocketmq import SimpleConsumer as OfficialSimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from common.broker.broker import Broker
from common.client import Admin, Producer, SimpleConsumer
from common.core.errors import ConfigError
from common.proxy.auth import DATE_HEADER, parse_authorization, peer_address, sign

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))

from security_harness import Realm

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

ORDERS_SK = "orders-secret-0123456789"
BILLING_SK = "billing-secret-0123456789"
OPS_SK = "ops-secret-0123456789abcd"


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    cert, key = make_certificate(tmp_path_factory.mktemp("tls"))
    os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(cert)  # read at the first TLS channel
    return cert, key


def accounts(realm: Realm, **orders_fields: Any) -> list[dict[str, Any]]:
    return [
        realm.account("broker", replica=True),
        realm.account("admin", admin=True),
        realm.account("frontend", admin=True),
        {"accessKey": "orders-app", "secretKey": ORDERS_SK, "topicPerms": ["orders=PUB"],
         **orders_fields},
        {"accessKey": "billing-app", "secretKey": BILLING_SK, "topicPerms": ["orders=SUB"],
         "groupPerms": ["billing=SUB"]},
        {"accessKey": "ops", "secretKey": OPS_SK, "admin": True},
    ]


@pytest.fixture
def realm(tmp_path: Path) -> Realm:
    realm = Realm(tmp_path / "realm", ["frontend"])
    realm.write_acl(accounts(realm), mode=0o600)  # it holds secret keys
    return realm


def secure_fields(realm: Realm, certificate: tuple[Path, Path]) -> dict[str, Any]:
    return realm.broker_fields(grpcServerPort=free_port(), tlsCertPath=str(certificate[0]),
                               tlsKeyPath=str(certificate[1]),
                               grpcClientKeyFile=str(realm.key("frontend")))


@pytest.fixture
def broker(make_broker: Callable[..., Broker], realm: Realm,
           certificate: tuple[Path, Path]) -> Broker:
    b = make_broker(real_store=True, brokerName="gs", defaultTopicQueueNums=2,
                    **secure_fields(realm, certificate))
    with Admin([addr(b)], **realm.curve("admin")) as admin:
        for topic in ("orders", "audit"):
            admin.create_topic(topic, 2)
    return b


def endpoint(broker: Broker) -> str:
    return f"127.0.0.1:{broker.cfg.grpcServerPort}"


def client_config(broker: Broker, ak: str, sk: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint(broker), Credentials(ak, sk), request_timeout=5)


@pytest.fixture
def orders_producer(broker: Broker) -> Iterator[Any]:
    p = OfficialProducer(client_config(broker, "orders-app", ORDERS_SK), ("orders",),
                         tls_enable=True)
    p.startup()
    yield p
    p.shutdown()


def message(topic: str, body: bytes) -> Message:
    m = Message()
    m.topic, m.body = topic, body
    return m


def signed(ak: str, sk: str, date_time: str = "20261128T101010Z") -> list[tuple[str, str]]:
    value = (f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders={DATE_HEADER}, "
             f"Signature={sign(sk, date_time)}")
    return [(DATE_HEADER, date_time), ("authorization", value)]


@pytest.fixture
def stub(broker: Broker, certificate: tuple[Path, Path]) -> Iterator[Any]:
    creds = grpc.ssl_channel_credentials(certificate[0].read_bytes())
    with grpc.secure_channel(endpoint(broker), creds) as channel:
        yield service_pb2_grpc.MessagingServiceStub(channel)


def route(stub: Any, topic: str, metadata: list[tuple[str, str]]) -> Any:
    return stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name=topic)),
                           metadata=metadata, timeout=10)


# ---- the signature -------------------------------------------------------------------------


def test_the_signature_is_what_the_official_client_computes() -> None:
    from rocketmq.v5.util.signature import Signature

    class Config:  # what Signature.metadata reads of a ClientConfiguration
        credentials = Credentials("orders-app", ORDERS_SK)
        namespace = ""

    headers = dict(Signature.metadata(Config(), "client-1"))
    access_key, signature = parse_authorization(headers["authorization"])
    assert access_key == "orders-app"
    assert signature == sign(ORDERS_SK, headers[DATE_HEADER])


@pytest.mark.parametrize(("value", "message"), [
    ("Basic abc", "only MQv2-HMAC-SHA1"),
    ("MQv2-HMAC-SHA1 Credential=a, SignedHeaders=x-mq-date-time", "no Credential or no"),
    ("MQv2-HMAC-SHA1 Credential=a, SignedHeaders=host, Signature=00", "must name"),
    ("MQv2-HMAC-SHA1 " + "x" * 2000, "characters"),
])
def test_a_header_that_is_not_a_signature_is_refused(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_authorization(value)


def test_peer_addresses() -> None:
    assert peer_address("ipv4:10.0.0.7:5123") == "10.0.0.7"
    assert peer_address("ipv6:[::1]:5123") == "::1"
    assert peer_address("unix:/tmp/s") == ""


# ---- the official clients, signed, over TLS ------------------------------------------------


def test_signed_official_clients_send_and_receive_over_tls(broker: Broker,
                                                         orders_producer: Any) -> None:
    receipt = orders_producer.send(message("orders", b"order 1"))
    assert receipt.message_id
    consumer = OfficialSimpleConsumer(client_config(broker, "billing-app", BILLING_SK),
                                      "billing", {"orders": FilterExpression()},
                                      await_duration=2, tls_enable=True)
    consumer.startup()
    try:
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = consumer.receive(16, 30)
        assert [m.body for m in got] == [b"order 1"]
        consumer.ack(got[0])
    finally:
        consumer.shutdown()


def test_no_account_reaches_what_its_permissions_deny(broker: Broker, orders_producer: Any,
                                                      realm: Realm, stub: Any) -> None:
    from rocketmq.v5.exception.client_exception import ForbiddenException

    with pytest.raises(Exception, match="route"):  # neither PUB nor SUB: not even the route
        orders_producer.send(message("audit", b"x"))
    answer = route(stub, "audit", signed("orders-app", ORDERS_SK))
    assert answer.status.code == pb.FORBIDDEN
    assert "orders-app has no permission to PUB|SUB Topic:audit" in answer.status.message
    sent = stub.SendMessage(rpc.SendMessageRequest(messages=[pb.Message(
        topic=pb.Resource(name="audit"), body=b"z",
        system_properties=pb.SystemProperties(message_id="m1"))]),
        metadata=signed("orders-app", ORDERS_SK), timeout=10)
    assert sent.status.code == pb.FORBIDDEN
    billing = OfficialProducer(client_config(broker, "billing-app", BILLING_SK), ("orders",),
                               tls_enable=True)
    billing.startup()
    try:
        with pytest.raises(ForbiddenException, match="billing-app has no permission to PUB"):
            billing.send(message("orders", b"y"))
    finally:
        billing.shutdown()
    with SimpleConsumer([addr(broker)], "billing", **realm.curve("admin")) as c:
        assert c.receive("audit", 16, 30_000, 0) == []  # nothing got through
    denied = broker.security.audit.counts()[1]
    assert denied.get(("grpc", "PUB", "deny"), 0) >= 1  # audit: defaultTopicPerm DENY
    assert denied.get(("grpc", "PUB", "no_perm"), 0) >= 1  # orders: topicPerms SUB


def test_unsigned_or_wrongly_signed_calls_are_unauthorized(broker: Broker, stub: Any) -> None:
    assert route(stub, "orders", signed("orders-app", ORDERS_SK)).status.code == pb.OK
    for metadata, why in [
        ([], "not signed"),
        (signed("orders-app", "wrong-secret-0123456789"), "signature does not match"),
        (signed("admin", ORDERS_SK), "has no secretKey"),  # a CURVE-only account
        (signed("nobody", ORDERS_SK), "in no account"),
        ([(DATE_HEADER, "20261128T101010Z"), ("authorization", "Basic x")], "authorization"),
    ]:
        answer = route(stub, "orders", metadata)
        assert answer.status.code == pb.UNAUTHORIZED, (metadata, answer)
        assert why in answer.status.message
    # a streaming call too, and one the front end does not serve
    [first] = list(stub.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=pb.Resource(name="billing"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="orders"))), timeout=10))
    assert first.status.code == pb.UNAUTHORIZED
    assert stub.UpdateOffset(rpc.UpdateOffsetRequest(),
                             timeout=10).status.code == pb.UNAUTHORIZED
    denied = broker.security.audit.counts()[1]
    assert denied.get(("grpc", "CONNECT", "bad_signature"), 0) >= 1
    assert denied.get(("grpc", "CONNECT", "unsigned"), 0) >= 2


def test_a_plain_channel_gets_nothing_from_the_tls_port(broker: Broker) -> None:
    with grpc.insecure_channel(endpoint(broker)) as channel:
        plain = service_pb2_grpc.MessagingServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            route(plain, "orders", signed("orders-app", ORDERS_SK))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_an_ack_is_checked_on_each_receipt_handles_topic(broker: Broker, stub: Any,
                                                        realm: Realm) -> None:
    """billing-app may SUB orders; a handle of audit (popped by ops) named under orders is
    refused, and the message stays un-acked."""
    with Producer([addr(broker)], **realm.curve("admin")) as p:
        p.send("audit", b"secret")
    popped = list(stub.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=pb.Resource(name="billing"), batch_size=1,
        message_queue=pb.MessageQueue(topic=pb.Resource(name="audit")),
        long_polling_timeout={"seconds": 5}, invisible_duration={"seconds": 60}),
        metadata=signed("ops", OPS_SK), timeout=20))
    [handle] = [r.message.system_properties.receipt_handle for r in popped
                if r.HasField("message")]
    ack = stub.AckMessage(rpc.AckMessageRequest(
        group=pb.Resource(name="billing"), topic=pb.Resource(name="orders"),
        entries=[rpc.AckMessageEntry(message_id="m", receipt_handle=handle)]),
        metadata=signed("billing-app", BILLING_SK), timeout=10)
    assert ack.status.code == pb.FORBIDDEN and "Topic:audit" in ack.status.message
    again = stub.ChangeInvisibleDuration(rpc.ChangeInvisibleDurationRequest(
        group=pb.Resource(name="billing"), topic=pb.Resource(name="orders"),
        receipt_handle=handle, invisible_duration={"seconds": 0}),
        metadata=signed("billing-app", BILLING_SK), timeout=10)
    assert again.status.code == pb.FORBIDDEN
    ok = stub.AckMessage(rpc.AckMessageRequest(
        group=pb.Resource(name="billing"), topic=pb.Resource(name="audit"),
        entries=[rpc.AckMessageEntry(message_id="m", receipt_handle=handle)]),
        metadata=signed("ops", OPS_SK), timeout=10)
    assert ok.status.code == pb.OK  # it was still un-acked


def test_an_account_disabled_by_a_reload_is_refused_on_an_open_channel(
        broker: Broker, realm: Realm, orders_producer: Any) -> None:
    from rocketmq.v5.exception.client_exception import UnauthorizedException

    orders_producer.send(message("orders", b"before"))
    realm.write_acl(accounts(realm, enabled=False), mode=0o600)
    acl = broker.security.acl
    assert acl is not None
    acl.poll(force=True)  # or the poller did
    assert not acl.current.by_access_key["orders-app"].enabled
    with pytest.raises(UnauthorizedException, match="disabled"):
        orders_producer.send(message("orders", b"after"))


# ---- what is refused at start --------------------------------------------------------------


def test_an_acl_file_with_secrets_others_may_read_is_refused(
        make_broker: Callable[..., Broker], realm: Realm,
        certificate: tuple[Path, Path]) -> None:
    os.chmod(realm.acl_path, 0o644)
    with pytest.raises(ConfigError, match="holds secretKeys.*chmod 600"):
        make_broker(real_store=True, **secure_fields(realm, certificate))


def test_the_front_end_needs_tls_and_an_admin_key(make_broker: Callable[..., Broker],
                                                  realm: Realm,
                                                  certificate: tuple[Path, Path]) -> None:
    fields = secure_fields(realm, certificate)
    with pytest.raises(ConfigError, match="tlsCertPath"):
        make_broker(**{**fields, "tlsCertPath": "", "tlsKeyPath": ""})
    with pytest.raises(ConfigError, match="grpcClientKeyFile"):
        make_broker(**{**fields, "grpcClientKeyFile": ""})
    with pytest.raises(ConfigError, match="grpcClientKeyFile.*account broker's.*admin"):
        make_broker(real_store=True, **{**fields, "grpcClientKeyFile": str(realm.key("broker"))})
    os.chmod(certificate[1], 0o644)
    try:
        with pytest.raises(ConfigError, match="tlsKeyPath.*chmod 600"):
            make_broker(real_store=True, **fields)
    finally:
        os.chmod(certificate[1], 0o600)


def test_replog_proxy_authenticates_for_brokers_that_run_with_acl(
        make_broker: Callable[..., Broker], realm: Realm,
        certificate: tuple[Path, Path]) -> None:
    """``replog proxy`` over a secure cluster: the same ACL file and TLS keys, its own admin
    key to the brokers; without its key it refuses to start (exit 2, the flags named)."""
    import subprocess

    b = make_broker(real_store=True, brokerName="ps", **realm.broker_fields())
    with Admin([addr(b)], **realm.curve("admin")) as admin:
        admin.create_topic("orders", 2)
    port = free_port()
    command = ["proxy", "-s", addr(b), "--json",
               "--set", f"grpcServerPort={port}", "--set", "aclEnable=true",
               "--set", f"aclFile={realm.acl_path}", "--set", f"tlsCertPath={certificate[0]}",
               "--set", f"tlsKeyPath={certificate[1]}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLOG_")}
    refused = subprocess.run([sys.executable, "-m", "common.cli", *command],
                             capture_output=True, text=True, timeout=60, check=False,
                             env={**env, "PYTHONPATH": os.getcwd()})
    assert refused.returncode == 2 and "--key" in refused.stderr, refused.stderr[-2000:]
    keys = ["--key", str(realm.key("frontend")), "--server-key",
            str(realm.keys / "broker.key")]
    with replog_child(*command, *keys, ready=str(port),
                      log=realm.root / "proxy.err") as (_proc, ready):
        assert '"acl": true' in ready
        p = OfficialProducer(ClientConfiguration(f"127.0.0.1:{port}",
                                                 Credentials("orders-app", ORDERS_SK)),
                             ("orders",), tls_enable=True)
        p.startup()
        try:
            assert p.send(message("orders", b"via the secure proxy")).message_id
        finally:
            p.shutdown()
        with SimpleConsumer([addr(b)], "billing", **realm.curve("admin")) as c:
            got = c.receive("orders", 16, 30_000, 2_000)
        assert [r.message.body for r in got] == [b"via the secure proxy"]
