"""The official RocketMQ 5 clients across failovers (issue 41): a controller-mode group of three
SYNC_MASTER members behind ``replog proxy`` (its own process, over all three); the official
Python client's Producer sends and its SimpleConsumer receives and acks, unchanged, while the
master is SIGKILLed five times (each time it rejoins as a slave). Every message the producer
was told was sent (a send receipt) is received by the consumer in the end: 0 lost."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from broker_harness import REPO, free_port
from controller_harness import Group, chroot, running_zookeeper, wait_sync_state_set

from common.client import Admin

pytestmark = pytest.mark.integration

TOPIC, GROUP = "grpcd", "grpcg"
KILLS = 5


class Sending(threading.Thread):
    """The official Producer, one message at a time; keeps what it got a receipt for."""

    def __init__(self, endpoint: str):
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.stop = threading.Event()
        self.acked: dict[int, str] = {}  # seq -> message id
        self.failed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        from rocketmq import ClientConfiguration, Credentials, Message, Producer

        try:
            producer = Producer(ClientConfiguration(self.endpoint, Credentials()), (TOPIC,))
            producer.startup()
            try:
                seq = 0
                while not self.stop.is_set():
                    seq += 1
                    msg = Message()
                    msg.topic, msg.body = TOPIC, b"%d" % seq
                    try:
                        receipt = producer.send(msg)
                    except Exception:  # noqa: BLE001 - not acknowledged: not counted
                        self.failed += 1
                        self.stop.wait(0.1)
                        continue
                    self.acked[seq] = receipt.message_id
                    self.stop.wait(0.01)
            finally:
                producer.shutdown()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


class Receiving(threading.Thread):
    """The official SimpleConsumer: receives, acks; keeps every body it was handed."""

    def __init__(self, endpoint: str):
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.stop = threading.Event()
        self.got: set[int] = set()
        self.handed = 0
        self.errors = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

        try:
            consumer = SimpleConsumer(ClientConfiguration(self.endpoint, Credentials()), GROUP,
                                      {TOPIC: FilterExpression()}, await_duration=2)
            consumer.startup()
            try:
                while not self.stop.is_set():
                    try:
                        messages = consumer.receive(16, 10)
                    except Exception:  # noqa: BLE001 - an election: asked again
                        self.errors += 1
                        self.stop.wait(0.2)
                        continue
                    for m in messages:
                        self.handed += 1
                        self.got.add(int(m.body))
                        try:
                            consumer.ack(m)
                        except Exception:  # noqa: BLE001 - handed out again later
                            self.errors += 1
            finally:
                consumer.shutdown()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


@pytest.mark.timeout(600)
def test_the_official_clients_lose_nothing_across_five_master_kills(tmp_path: Path) -> None:
    rng = random.Random(41)
    failovers: list[float] = []
    with running_zookeeper(tmp_path / "zk") as zk, \
            Group(tmp_path, zk.hosts + chroot()) as g:
        wait_sync_state_set(g.master().status, {1, 2, 3})
        with Admin(g.addresses, timeout_ms=5000) as admin:
            admin.create_topic(TOPIC, 4)
        port = free_port()
        proxy = subprocess.Popen(
            [sys.executable, "-m", "common.cli", "proxy", "-s", ",".join(g.addresses),
             "--grpc-port", str(port), "--listen", "127.0.0.1", "--json"],
            stdout=subprocess.PIPE, stderr=(tmp_path / "proxy.err").open("w"), cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        sender = receiver = None
        try:
            assert proxy.stdout is not None
            assert str(port) in proxy.stdout.readline().decode(), \
                (tmp_path / "proxy.err").read_text()[-2000:]
            endpoint = f"127.0.0.1:{port}"
            sender, receiver = Sending(endpoint), Receiving(endpoint)
            sender.start()
            receiver.start()
            deadline = time.monotonic() + 30
            while len(sender.acked) < 20 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(sender.acked) >= 20, (sender.failed, sender.error)
            for _ in range(KILLS):
                time.sleep(rng.uniform(1.5, 3.0))
                failovers.append(g.kill_master())
            time.sleep(2.0)
            sender.stop.set()
            sender.join(60)
            want = dict(sender.acked)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not set(want) <= receiver.got:
                time.sleep(0.5)
        finally:
            for t in (sender, receiver):
                if t is not None:
                    t.stop.set()
            for t in (sender, receiver):
                if t is not None:
                    t.join(60)
            proxy.send_signal(signal.SIGTERM)
            try:
                proxy.wait(20)
            except subprocess.TimeoutExpired:
                proxy.kill()
                proxy.wait(10)
    assert sender is not None and receiver is not None
    lost = sorted(set(want) - receiver.got)
    summary = {"drill": "grpc-failover", "kills": KILLS, "failover_s": failovers,
               "sent": len(want), "send_failures": sender.failed, "handed_out": receiver.handed,
               "distinct_received": len(receiver.got), "consumer_errors": receiver.errors,
               "lost": len(lost)}
    print(json.dumps(summary))
    assert sender.error is None and receiver.error is None, (sender.error, receiver.error)
    assert len(want) > 100, summary
    assert not lost, f"{summary}; sent with a receipt, never received: {lost[:10]}"
