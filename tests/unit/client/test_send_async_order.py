"""Order per key with ``send_async`` (issue 21, item 5).

Messages sent with a ``shard_key`` are stored in the order they were sent, also when a batch
of them fails and is retried: a queue that carries keyed messages has at most one batch in
flight, and a failed batch goes back to the front of its queue while everything sent after it
waits (Kafka's producer keeps order with retries the same way: one request in flight per
partition, the retried batch re-enqueued first). Keyless sends keep two batches in flight.

The broker is in this process (the fake store records what is stored, in order); a wrapper
around its write handler injects a retriable refusal (SYSTEM_BUSY, nothing stored) for chosen
batches, answered late so that later batches could overtake it.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

import pytest
from helpers.brokers import addr

from common.broker.broker import Broker
from common.client import Producer
from common.core.errors import ResponseCode, SendStatus
from common.format.protocol import Request, RequestCode, Response, decode_record

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

REFUSAL_DELAY_S = 0.2  # the refused batch is answered this late: later ones could pass it


class Injector:
    """Wraps the master role's ``send_batch``: the batches whose first body is in ``refuse``
    are answered SYSTEM_BUSY (retriable, nothing stored) after REFUSAL_DELAY_S, once each."""

    def __init__(self, broker: Broker, refuse: set[bytes]) -> None:
        self.refuse = set(refuse)
        self.batches: list[list[bytes]] = []  # every SEND_BATCH seen, in arrival order
        role: Any = broker.role
        self._handle = role.send_batch
        role.send_batch = self.handle

    def handle(self, req: Request) -> Any:
        assert req.code == RequestCode.SEND_BATCH
        bodies = [bytes(b) for b in req.bodies]
        self.batches.append(bodies)
        first = bodies[0] if bodies else b""
        if first not in self.refuse:
            return self._handle(req)
        self.refuse.discard(first)
        out: concurrent.futures.Future[Response] = concurrent.futures.Future()
        refusal = Response(ResponseCode.SYSTEM_BUSY, req.opaque, "injected", {}, [])
        timer = threading.Timer(REFUSAL_DELAY_S, out.set_result, (refusal,))
        timer.daemon = True
        timer.start()
        return out


def stored_bodies(broker: Broker, topic: str, queue_id: int) -> list[bytes]:
    store: Any = broker.store
    return [decode_record(store.by_phy[phy]).body
            for phy in store.queues.get((topic, queue_id), [])]


def test_keyed_sends_keep_their_order_through_retried_batches(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(defaultTopicQueueNums=4)
    bodies = [b"k-%03d" % i for i in range(60)]
    # every 10th message heads a refused batch, as far as batches start there
    injector = Injector(broker, {bodies[i] for i in range(0, 60, 10)})
    with Producer([addr(broker)], batch_size=4, max_batches_in_flight=2, retries=5) as p:
        p.send("o", b"warm-up", queue_id=0)
        futures = [p.send_async("o", b, shard_key="order-42") for b in bodies]
        results = [f.result(30) for f in futures]
    assert all(r.status == SendStatus.SEND_OK for r in results)
    (queue,) = {r.queue_id for r in results}
    assert [r.queue_offset for r in results] == sorted(r.queue_offset for r in results)
    stored = [b for b in stored_bodies(broker, "o", queue) if b.startswith(b"k-")]
    assert stored == bodies  # each once, in the order sent
    assert len(injector.refuse) < 6  # refusals did happen (batches started at those bodies)


def test_a_refused_keyed_batch_holds_the_later_ones_back(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(defaultTopicQueueNums=2)
    bodies = [b"k-%03d" % i for i in range(20)]
    injector = Injector(broker, {bodies[0]})
    with Producer([addr(broker)], batch_size=2, linger_ms=50, max_batches_in_flight=2,
                  retries=3) as p:
        futures = [p.send_async("o", b, shard_key="order-7") for b in bodies]
        results = [f.result(30) for f in futures]
    queue = results[0].queue_id
    assert stored_bodies(broker, "o", queue) == bodies
    # the refused batch came back first: nothing of the key arrived while it was out
    first_refused = next(i for i, b in enumerate(injector.batches) if b[0] == bodies[0])
    retried = next(i for i, b in enumerate(injector.batches)
                   if i > first_refused and b[0] == bodies[0])
    assert retried == first_refused + 1, injector.batches[:6]


def test_keyless_sends_keep_two_batches_in_flight(make_broker: Callable[..., Broker]) -> None:
    """Throughput for keyless sends: a second batch of a queue goes out while the first waits
    for its answer (the refused one, answered late)."""
    broker = make_broker(defaultTopicQueueNums=1)
    bodies = [b"u-%03d" % i for i in range(20)]
    injector = Injector(broker, {bodies[0]})
    with Producer([addr(broker)], batch_size=2, linger_ms=50, max_batches_in_flight=2,
                  retries=3) as p:
        futures = [p.send_async("u", b, queue_id=0) for b in bodies]
        results = [f.result(30) for f in futures]
    assert all(r.status == SendStatus.SEND_OK for r in results)
    first_refused = next(i for i, b in enumerate(injector.batches) if b[0] == bodies[0])
    retried = next(i for i, b in enumerate(injector.batches)
                   if i > first_refused and b[0] == bodies[0])
    assert retried > first_refused + 1  # another batch went out meanwhile
    assert sorted(stored_bodies(broker, "u", 0)) == bodies  # all stored, once


def test_keyed_order_holds_in_a_queue_shared_with_keyless_sends(
        make_broker: Callable[..., Broker]) -> None:
    """Keyless messages sent to the key's queue between keyed ones do not let a retried keyed
    batch fall behind a later keyed message."""
    broker = make_broker(defaultTopicQueueNums=4)
    keyed = [b"k-%03d" % i for i in range(40)]
    injector = Injector(broker, {keyed[i] for i in range(0, 40, 8)})
    with Producer([addr(broker)], batch_size=3, max_batches_in_flight=2, retries=5) as p:
        p.send("m", b"warm-up", queue_id=0)
        first = p.send_async("m", keyed[0], shard_key="order-9")
        queue = first.result(30).queue_id
        futures = [first]
        for i, body in enumerate(keyed[1:], 1):
            futures.append(p.send_async("m", body, shard_key="order-9"))
            futures.append(p.send_async("m", b"u-%03d" % i, queue_id=queue))  # keyless
        assert all(f.result(30).status == SendStatus.SEND_OK for f in futures)
    stored = [b for b in stored_bodies(broker, "m", queue) if b.startswith(b"k-")]
    assert stored == keyed
    assert len(injector.refuse) < 5  # refusals did happen
