"""``Consumer``: pulls (long polling), queue offsets by time, consumer offsets, send-back."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from common.client.cluster import ClientBase
from common.client.results import (
    NoMasterError,
    PullResult,
    SendResult,
    pull_result,
    send_results,
)
from common.client.transport import DEFAULT_SPIN_US, DEFAULT_TIMEOUT_MS
from common.core.errors import BrokerError, ResponseCode
from common.core.keys import ClientKeys
from common.core.message import (
    DEFAULT_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    MessageExt,
)
from common.format.protocol import RequestCode


class Consumer(ClientBase):
    """Pulls from a broker group's consume queues; commits and fetches consumer offsets."""

    def __init__(
        self,
        servers: str | Iterable[str],
        group: str = "DEFAULT_CONSUMER",
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retries: int = 2,
        read_from: str | None = None,
        spin_us: int = DEFAULT_SPIN_US,
        key: str | os.PathLike[str] | None = None,
        server_key: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        curve: ClientKeys | None = None,
    ):
        """``read_from``: where pulls and offset reads go. None or "master": the master, and a
        slave of the group while no master answers (RocketMQ 4.x consumers do so during a
        failover); "slave": the slaves in turn, the master when none answers; an address:
        that broker only. Offset commits always go to the master; one made while no master
        answers is kept here and sent with the next one that reaches a master (``close``
        tries too), so a failover loses none of them.
        ``key``, ``server_key``, ``curve``: CURVE (``ClientBase``, docs/security.md)."""
        super().__init__(servers, timeout_ms, retries, key=key, server_key=server_key,
                         curve=curve, spin_us=spin_us)
        self.group = group
        self.read_from = read_from
        self._unsent_commits: dict[tuple[str, int], tuple[int, str | None]] = {}
        self._commits_lock = threading.Lock()

    def pull(
        self,
        topic: str,
        queue_id: int = 0,
        offset: int = 0,
        max_nums: int = 32,
        suspend_ms: int = 0,
        tags: str | None = None,
    ) -> PullResult:
        """Read from a consume queue; ``suspend_ms`` > 0 long-polls at the end of the queue."""
        fields: dict[str, Any] = {
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": offset,
            "maxNums": max_nums,
            "group": self.group,
            "suspendMs": suspend_ms,
        }
        if tags:
            fields["tags"] = tags

        def attempt(address: str) -> PullResult:
            resp = self._cluster.request(
                address,
                RequestCode.PULL,
                fields,
                timeout_ms=self.timeout_ms + suspend_ms,
            )
            return pull_result(resp)

        return self._read(attempt)  # type: ignore[no-any-return]

    def _read(self, attempt: Any) -> Any:
        return self._with_retries(attempt, read_from=self.read_from, read=True)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The oldest queue offset still held (RocketMQ ``minOffset``, Kafka
        ``beginning_offsets``); 0 for a queue that does not exist."""
        return self._queue_offset(RequestCode.GET_MIN_OFFSET, topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Where the queue's next message will go (RocketMQ ``maxOffset``, Kafka
        ``end_offsets``); 0 for a queue that does not exist."""
        return self._queue_offset(RequestCode.GET_MAX_OFFSET, topic, queue_id)

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms`` (ms
        since the epoch; RocketMQ ``searchOffset``, Kafka ``offsets_for_times``): the max offset
        when every message is older, so pulling from it waits for new ones."""
        return self._queue_offset(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic, queue_id, timestamp=timestamp_ms
        )

    def queue_nums(self, topic: str, fresh: bool = True) -> int:
        """How many queues the topic has, asked of the master each time (``fresh`` or not);
        BrokerError
        TOPIC_NOT_EXIST when it has no such topic. (A producer's view, ``ClientBase.queue_nums``,
        is cached and counts the queues a first send would auto-create: a consumer's view
        counts only queues that exist.)"""

        def attempt(address: str) -> int:
            resp = self._cluster.request(address, RequestCode.TOPIC_ROUTE, {"topic": topic})
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return int(resp.fields["queueNums"])

        return self._with_retries(attempt)  # type: ignore[no-any-return]

    def _queue_offset(self, code: RequestCode, topic: str, queue_id: int, **extra: int) -> int:
        fields: dict[str, Any] = {"topic": topic, "queueId": queue_id, **extra}

        def attempt(address: str) -> int:
            resp = self._cluster.request(address, code, fields)
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return int(resp.fields["offset"])

        return self._read(attempt)  # type: ignore[no-any-return]

    def heartbeat(self, client_id: str, session_timeout_ms: int = 10_000, leave: bool = False
                  ) -> list[str]:
        """Tell the group's master that ``client_id`` of this group is alive for the next
        ``session_timeout_ms`` (or, with ``leave``, gone); returns the group's live members,
        sorted (``GroupConsumer``)."""
        fields = {"group": self.group, "clientId": client_id,
                  "sessionTimeoutMs": session_timeout_ms, "leave": int(leave)}

        def attempt(address: str) -> list[str]:
            resp = self._cluster.request(address, RequestCode.CONSUMER_HEARTBEAT, fields)
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return [str(m) for m in resp.fields.get("members", [])]

        return self._with_retries(attempt)  # type: ignore[no-any-return]

    def commit_offset(self, topic: str, queue_id: int, offset: int,
                      client_id: str | None = None) -> None:
        """Commit the group's next offset for the queue; with ``client_id`` (a group member)
        the master refuses it (CONSUMER_NOT_ONLINE) unless the member owns the queue."""
        if self._unsent_commits and not self.flush_commits():
            with self._commits_lock:  # still no master: keep this one too, newest wins
                self._unsent_commits[(topic, queue_id)] = (offset, client_id)
            return
        try:
            self._commit_now(topic, queue_id, offset, client_id)
        except NoMasterError:
            with self._commits_lock:
                self._unsent_commits[(topic, queue_id)] = (offset, client_id)

    def _commit_now(self, topic: str, queue_id: int, offset: int,
                    client_id: str | None) -> None:
        fields: dict[str, Any] = {"group": self.group, "topic": topic, "queueId": queue_id,
                                  "queueOffset": offset}
        if client_id:
            fields["clientId"] = client_id

        def attempt(address: str) -> None:
            resp = self._cluster.request(address, RequestCode.COMMIT_OFFSET, fields)
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)

        self._with_retries(attempt, wait_for_master=False)

    def send_back(self, msg: MessageExt, delay_level: int = 0,
                  max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES) -> SendResult:
        """RocketMQ's ``sendMessageBack``: this group failed ``msg``, so the master stores a copy
        in the group's retry topic ``%RETRY%<group>``, due after ``delay_level`` (0: the
        broker's choice, level 3 + the times it came back already), or in its dead-letter topic
        ``%DLQ%<group>`` once it came back ``max_reconsume_times`` times (or at once with
        ``delay_level`` -1). The result names the copy (``topic`` is the retry or DLQ topic).

        Only a ``SEND_OK`` result means the copy is as safe as a sent message (a SYNC_MASTER's
        slave holds it): commit past ``msg`` after that, not before. A retried request may store
        two copies (at least once)."""
        if not -1 <= delay_level <= 64:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                              f"delay_level {delay_level} is not -1..64", False)
        fields: dict[str, Any] = {
            "group": self.group, "offset": msg.commit_log_offset, "originTopic": msg.topic,
            "delayLevel": delay_level, "maxReconsumeTimes": max_reconsume_times,
        }
        origin = msg.properties.get(PROPERTY_ORIGIN_MESSAGE_ID) or msg.msg_id
        if origin:
            fields["originMsgId"] = origin

        def attempt(address: str) -> SendResult:
            resp = self._cluster.request(address, RequestCode.CONSUMER_SEND_MSG_BACK, fields)
            topic = resp.fields.get("topic")
            return send_results(topic if isinstance(topic, str) else "", resp)[0]

        return self._with_retries(attempt)  # type: ignore[no-any-return]

    def fetch_offset(self, topic: str, queue_id: int) -> int:
        """The group's committed offset for the queue, or -1 when none was committed."""
        fields = {"group": self.group, "topic": topic, "queueId": queue_id}

        with self._commits_lock:
            unsent = self._unsent_commits.get((topic, queue_id))
        if unsent is not None:
            return unsent[0]  # committed here while no master answered: that is the newest

        def attempt(address: str) -> int:
            resp = self._cluster.request(address, RequestCode.FETCH_OFFSET, fields)
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return int(resp.fields.get("queueOffset", -1))

        return self._read(attempt)  # type: ignore[no-any-return]

    @property
    def unsent_commits(self) -> dict[tuple[str, int], int]:
        """Offsets committed while no master answered, not yet sent: (topic, queue) -> offset."""
        with self._commits_lock:
            return {k: v[0] for k, v in self._unsent_commits.items()}

    def flush_commits(self) -> bool:
        """Send the offsets kept while no master answered; True when none is left."""
        with self._commits_lock:
            unsent = dict(self._unsent_commits)
        for (topic, queue_id), (offset, client_id) in unsent.items():
            try:
                self._commit_now(topic, queue_id, offset, client_id)
            except NoMasterError:
                return False
            with self._commits_lock:
                if self._unsent_commits.get((topic, queue_id)) == (offset, client_id):
                    del self._unsent_commits[(topic, queue_id)]
        return True

    def close(self) -> None:
        if self._unsent_commits and not self._closed.is_set():
            try:
                self.flush_commits()
            except BrokerError:
                pass  # reported by unsent_commits; nothing else to do at close
        super().close()
