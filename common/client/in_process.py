"""Blocking calls to a broker running in this process, with no socket: a client built with
``in_process={address: calls}`` (the gRPC front end in a broker, ``common/proxy/local.py``)
sends the requests of ``IN_PROCESS_CODES`` to ``address`` through ``calls`` (the broker's
``common/broker/local_calls.py``), where the request server serves them exactly as it serves
its socket's. Everything else, and every other address, goes through the client's sockets.

Only requests that leave no trace of the connection they came on are taken this way: a
PRODUCER_HEARTBEAT registers its connection for the broker's own requests to the client (a
transaction check-back), which an in-process caller cannot answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from common.client.results import ClientTimeoutError
from common.core.errors import BrokerError
from common.format.protocol import RequestCode, Response, encode_request

IN_PROCESS_CODES = frozenset({
    RequestCode.SEND, RequestCode.SEND_BATCH, RequestCode.CONSUMER_SEND_MSG_BACK,
    RequestCode.POP_MESSAGE, RequestCode.ACK_MESSAGE, RequestCode.BATCH_ACK_MESSAGE,
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
})


class InProcess(Protocol):
    """A broker's in-process calls (``LocalCalls``): ``answer`` gets the Response, or the
    BrokerError of a server that stopped, on the broker's I/O thread; ``call`` raises
    BrokerError when the server takes no more calls."""

    def call(self, opaque_and_frames: Callable[[int], list[bytes]],
             answer: Callable[[Response | BrokerError], None]) -> None: ...

    def call_many(self, calls: Sequence[tuple[Callable[[int], list[bytes]],
                                              Callable[[Response | BrokerError], None]]]) -> None:
        """Several calls served in order as one burst; each refused one answered its
        BrokerError."""


def call_in_process(calls: InProcess, address: str, code: RequestCode,
                    fields: dict[str, Any] | None, bodies: Sequence[bytes],
                    timeout_ms: int) -> Response:
    """The broker's answer, waited for on this thread up to ``timeout_ms``
    (ClientTimeoutError after, as for a socket; a late answer is dropped)."""
    done = threading.Lock()
    done.acquire()  # released by the answer
    box: list[Response | BrokerError] = []

    def answer(outcome: Response | BrokerError) -> None:
        box.append(outcome)
        done.release()

    calls.call(lambda opaque: encode_request(code, opaque, fields, bodies), answer)
    if not done.acquire(timeout=timeout_ms / 1000):
        raise ClientTimeoutError(address, timeout_ms)
    outcome = box[0]
    if isinstance(outcome, BrokerError):
        raise outcome
    return outcome
