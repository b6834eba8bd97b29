"""A producer group member's presence at the brokers (RocketMQ's producer heartbeat): what
lets a broker send it requests (a transaction check-back; its running figures).

A ``Producer`` made with a ``group`` runs this: PRODUCER_HEARTBEAT to the master of every
broker group of the route table at once and then every ``heartbeat_ms`` (30 s, RocketMQ's
``heartbeatBrokerInterval``), sent through the client's I/O thread, whose connection is the one
the broker records and sends its requests on; ``leave`` to each on close. It serves
GET_CLIENT_RUNNING_INFO with the figures the producer hands it. A broker that does not hear
from it for 120 s forgets it (``common/broker/producer_groups.py``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from common.client.results import NoMasterError
from common.client.routes import Routes
from common.client.transport import Transport
from common.core.errors import BrokerError, ResponseCode
from common.format.protocol import Request, RequestCode, Response

log = logging.getLogger("replog.client")

DEFAULT_HEARTBEAT_MS = 30_000
LEAVE_TIMEOUT_MS = 1000


def new_client_id() -> str:
    """RocketMQ's clientId in spirit: host, process and instance."""
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


class Presence:
    def __init__(self, transport: Transport, routes: Routes, group: str, client_id: str,
                 heartbeat_ms: int, timeout_ms: int,
                 figures: Callable[[], dict[str, Any]]):
        self.group = group
        self.client_id = client_id
        self.heartbeat_ms = heartbeat_ms
        self._transport = transport
        self._routes = routes
        self._timeout_ms = timeout_ms
        self._figures = figures
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._masters: set[str] = set()  # the masters heartbeaten last round (leave goes there)
        self.rounds = 0
        transport.serve(RequestCode.GET_CLIENT_RUNNING_INFO, self._running_info)
        self._thread = threading.Thread(target=self._run, name="replog-producer-heartbeat",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop heartbeating and tell the masters this producer leaves (best effort)."""
        self._stop.set()
        self._thread.join(self._timeout_ms / 1000.0 + 1.0)
        self._round(leave=True, timeout_ms=LEAVE_TIMEOUT_MS)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._round(leave=False, timeout_ms=self._timeout_ms)
            except BrokerError as e:  # no route yet, no master: the next round tries again
                log.debug("event=producer_heartbeat_failed group=%s error=%s", self.group, e)
            self._stop.wait(self.heartbeat_ms / 1000.0)

    def _round(self, leave: bool, timeout_ms: int) -> None:
        if leave:
            masters = set(self._masters)
        else:
            masters = set()
            table = self._routes.wait_table(self._stop, timeout_ms)
            for name in table.group_names:
                try:
                    masters.add(self._routes.cluster(name, table).master())
                except NoMasterError:
                    continue
        fields = {"group": self.group, "clientId": self.client_id, "leave": int(leave)}
        calls: list[concurrent.futures.Future[Response]] = []
        for address in sorted(masters):
            try:  # through the I/O thread: its connection is what the broker sends requests on
                calls.append(self._transport.call(address, RequestCode.PRODUCER_HEARTBEAT,
                                                  fields, timeout_ms=timeout_ms))
            except BrokerError:
                return  # the client is closed
        for call in calls:
            try:
                resp = call.result(timeout_ms / 1000.0 + 1.0)
            except (BrokerError, concurrent.futures.TimeoutError) as e:
                log.debug("event=producer_heartbeat_failed group=%s error=%s", self.group, e)
                continue
            if not resp.ok:
                log.warning("event=producer_heartbeat_refused group=%s code=%s remark=%s",
                            self.group, resp.code.name, resp.remark)
        if not leave:
            self._masters = masters
            self.rounds += 1

    def _running_info(self, address: str, req: Request) -> Response:
        """GET_CLIENT_RUNNING_INFO from the broker at ``address`` (the requests thread)."""
        info = {"clientId": self.client_id, "group": self.group, "pid": os.getpid(),
                "host": socket.gethostname(),
                "uptimeMs": int((time.monotonic() - self._started) * 1000),
                "heartbeatRounds": self.rounds, **self._figures()}
        return Response(ResponseCode.SUCCESS, req.opaque, "", info, [])
