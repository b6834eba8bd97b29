"""Python clients: Producer, Consumer and Admin (docs/contract.md §4).

The package, one module a layer (everything is imported from ``common.client``)::

    results.py    SendResult / PullResult from an answer; ClientTimeoutError, NoMasterError...
    transport.py  the I/O thread and its sockets, blocking calls, send_async coalescing
    plain_call.py a blocking call's plain socket speaking ZMTP (no libzmq between)
    cluster.py    the cluster view (master discovery, topic routes); ClientBase's retry loop
    producer.py   Producer          consumer.py  Consumer          admin.py  Admin
    transaction.py TransactionProducer (half, local transaction, end; answers check-backs)
    simple_consumer.py SimpleConsumer (POP: receive, ack, change_invisible_duration)
    push_consumer.py PushConsumer (a listener on a thread pool, over SimpleConsumer)

Threads and sockets::

    user threads --(inbox deque + pipe wakeup)--> one I/O thread per client --ZMTP--> brokers
                 <---------- concurrent.futures.Future resolved by the I/O thread ----------

* One background I/O thread owns one connection per broker address: without CURVE keys a plain
  socket of its own speaking ZMTP as a DEALER (``common/format/zmtp_link.py``: no libzmq thread
  between a batch and its answer), with keys (or ``plain_calls=False``) a DEALER of a ZeroMQ
  context it owns. Any number of requests are in flight on a connection at once; answers are
  matched by their opaque id. Nothing is queued for a broker that is not connected (a DEALER's
  ``ZMQ_IMMEDIATE``; the request waits in a bounded backlog until the connection is up or its
  deadline passes), and heartbeats notice a frozen broker. (libzmq drops an IMMEDIATE socket's
  unread answers when its connection drops; a draining broker keeps its connections open a
  moment after its last answers for that, see ``common/broker/server.py``. A plain link reads
  what arrived before the close first.)
* A blocking call (``send``, ``send_batch``, ``pull``, ``status``...) runs on the calling
  thread's own connection. Without CURVE keys that is a plain TCP socket speaking ZMTP
  (``plain_call.py``: the caller writes the request and reads the answer itself, no libzmq
  I/O thread between; the same outcomes as below). With keys, or ``plain_calls=False``, it is
  a DEALER of its own (not IMMEDIATE, so an answer that arrives just before the broker closes
  is kept; no heartbeats, the call's deadline is enough; a call that times out closes the
  socket, and a request still waiting in it for a connection goes with it) and first polls
  for its answer without sleeping, up to ``spin_us`` (default 300 us), while recent answers
  have come that fast: waking a sleeping thread costs about as much as a loopback round trip
  on a VM. Slow answers (a SYNC_MASTER put, a long poll) turn this off by themselves;
  ``spin_us=0`` turns it off for good.
* Every request has a deadline (``timeout_ms``, default 10 s: longer than the broker's
  ``slaveTimeout`` and ``syncFlushTimeout`` so FLUSH_SLAVE_TIMEOUT and FLUSH_DISK_TIMEOUT reach the
  caller). A missed deadline raises ``ClientTimeoutError`` (a retriable ``BrokerError``; the send's
  outcome is unknown).
* Master discovery: the client asks every configured broker for its status and writes to the
  master with the highest epoch; a timeout or SERVICE_NOT_AVAILABLE / STALE_EPOCH answer drops
  the cached master so the next attempt discovers again.
* ``Producer.send_async`` coalesces like Kafka's producer: messages for the same queue
  accumulate while that queue has batches in flight (at most ``max_batches_in_flight`` per
  queue, default 2: while one batch waits for its answer, for a SYNC_MASTER the slave's ack, the
  next one is already being stored) and leave as one SEND_BATCH of at most ``batch_size``
  messages, or after ``linger_ms``. A queue's batches travel on one socket to one broker, which
  stores them in the order sent, so a queue keeps its order; a batch that fails and is retried
  lands after what was sent meanwhile (with any setting, as in Kafka without idempotence).
  Retries (only of errors marked retriable, at most ``retries``, with backoff) run on one small
  retry thread, never on the I/O thread.
"""

from common.client.admin import Admin
from common.client.base import ClientBase
from common.client.cluster import Cluster, parse_servers
from common.client.consumer import Consumer
from common.client.producer import Producer, shard_queue
from common.client.push_consumer import PushConsumer
from common.client.results import (
    PULL_CODES,
    SEND_CODES,
    ClientTimeoutError,
    ConnectionLostError,
    NoMasterError,
    PullResult,
    SendResult,
    pack_bodies,
    pull_result,
    send_results,
)
from common.client.simple_consumer import Received, SimpleConsumer
from common.client.transaction import HalfSent, TransactionProducer, TransactionResult
from common.client.transport import DEFAULT_SPIN_US, DEFAULT_TIMEOUT_MS, Transport, new_dealer
from common.core.transaction import TransactionState

__all__ = [
    "DEFAULT_SPIN_US",
    "DEFAULT_TIMEOUT_MS",
    "PULL_CODES",
    "SEND_CODES",
    "Admin",
    "ClientBase",
    "ClientTimeoutError",
    "Cluster",
    "ConnectionLostError",
    "Consumer",
    "HalfSent",
    "NoMasterError",
    "Producer",
    "PullResult",
    "PushConsumer",
    "Received",
    "SendResult",
    "SimpleConsumer",
    "TransactionProducer",
    "TransactionResult",
    "TransactionState",
    "Transport",
    "new_dealer",
    "pack_bodies",
    "parse_servers",
    "pull_result",
    "send_results",
    "shard_queue",
]
