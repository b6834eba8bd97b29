"""What a processor is handed: the request's context, and the broker as processors see it.

A processor (``handle(ctx, req) -> Reply | None``) belongs to no front end: the ZeroMQ request
server (``common/broker/server.py``) builds a ``Context`` per request today, and a second front
end (gRPC) can build its own and call the same processors. ``Reply``: a ``Response`` now, a
``concurrent.futures.Future[Response]`` (the front end sends its result when it completes), or a
``Deferred`` held by its owner (``common/broker/replies.py``); None: the request was parked
(``ctx.park``: a long poll) and the front end answers it later.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from common.broker.consumer_groups import ConsumerGroups
from common.broker.producer_groups import ProducerGroups
from common.broker.replies import Reply
from common.format.acl import Account, Denial
from common.format.protocol import Request, RequestCode, Response

if TYPE_CHECKING:
    from common.broker.long_polling import LongPoll
    from common.broker.subscription_groups import SubscriptionGroupTable
    from common.core.config import BrokerConfig
    from common.core.subscription import Subscription
    from common.format.tables import GroupConfig
    from common.store.api import Store


class AskClient(Protocol):
    def __call__(self, identity: bytes, code: RequestCode,
                 fields: Mapping[str, Any] | None = ..., bodies: Sequence[bytes] = ...,
                 timeout_ms: int = ...) -> concurrent.futures.Future[Response]: ...


class Caller(NamedTuple):
    """Who sent the request (security on): its account, its key (ZAP User-Id) and a handle the
    front end can audit a refusal with."""

    account: Account
    user: str
    handle: Any


class Writer(Protocol):
    """A master role's writes (``master/role.py``): each answers its request code."""

    def send(self, req: Request) -> Reply: ...

    def send_batch(self, req: Request) -> Reply: ...

    def create_topic(self, req: Request) -> Reply: ...

    def send_back(self, req: Request, max_reconsume_times: int) -> Reply: ...

    def recall(self, req: Request) -> Reply: ...

    def end_transaction(self, req: Request) -> Reply: ...

    def pop_message(self, req: Request, sub: Subscription, queues: list[int],
                    start: Callable[[int], int], order: bool,
                    max_reconsume_times: int) -> Reply: ...

    def ack_message(self, req: Request) -> Reply: ...

    def batch_ack(self, req: Request) -> Reply: ...

    def change_invisible(self, req: Request) -> Reply: ...


class Services(Protocol):
    """The broker as the processors see it (implemented by ``common.broker.broker.Broker``)."""

    cfg: BrokerConfig
    store: Store
    consumer_groups: ConsumerGroups  # CONSUMER_HEARTBEAT
    producer_groups: ProducerGroups  # PRODUCER_HEARTBEAT: live producers, by connection
    groups: SubscriptionGroupTable  # subscriptionGroup.json: the consumer groups' configs

    def status(self) -> dict[str, Any]: ...

    def cluster_info(self) -> dict[str, Any]: ...  # CLUSTER_INFO: groups, brokers, topics

    def topic_queue_nums(self, topic: str) -> tuple[int, bool]: ...  # (nums or 0, auto-create)

    def topic_layout(self, topic: str) -> dict[str, int]: ...  # group -> queues, the cluster's

    def commit_offset(self, group: str, topic: str, queue_id: int, queue_offset: int) -> None: ...

    def fetch_offset(self, group: str, topic: str, queue_id: int) -> int: ...

    def config_document(self, code: RequestCode) -> bytes: ...  # GET_ALL_*: the JSON file

    def ensure_retry_topic(self, group: str) -> None: ...

    # subscriptionGroup.json's entry (made now when autoCreateSubscriptionGroup), or None
    def group_config(self, group: str) -> GroupConfig | None: ...  # a master: %RETRY%<group> exists

    def writer(self, req: Request) -> Writer | Response: ...  # the master, or the refusal

    # DELETE_SUBSCRIPTIONGROUP: (had a config, offsets removed (``clean_offset``))
    def delete_group(self, group: str, clean_offset: bool) -> tuple[bool, int]: ...

    def promote(self, req: Request) -> Reply: ...

    def clear_election_fault(self) -> str: ...  # controller mode: the fault it had ("" none)

    def log_checksum(self, req: Request) -> Reply: ...  # LOG_CHECKSUM, off the I/O thread

    def acl_info(self) -> dict[str, Any]: ...  # GET_BROKER_CLUSTER_ACL_INFO


class Context(NamedTuple):
    """One request's context (a NamedTuple: the server makes one per request with
    ``tuple.__new__``, no Python-level ``__init__``). ``park`` hands a long poll to the front end; ``refused`` audits a
    refusal found while processing (a look-up's message in a topic the caller may not read)
    and returns the remark the caller gets (the front end's ``audit`` with this caller);
    ``ask`` sends a request to a client on the connection ``identity`` names
    (``common/broker/client_requests.py``); ``draining``: the broker is shutting down (no
    request is parked then)."""

    services: Services
    caller: Caller | None
    identity: bytes  # the connection the request came on (a ROUTER identity)
    started: float
    park: Callable[[LongPoll], None]
    audit: Callable[[Caller | None, Denial], str]
    ask: AskClient
    draining: bool = False

    def refused(self, denial: Denial) -> str:
        return self.audit(self.caller, denial)
