"""What a request processor hands back: an answer now (``reply``), a Future that resolves to
one on any thread, or a ``Deferred`` that its owner (a ``LoopWaits``) answers later on the
request server's I/O thread (``common/broker/server.py`` tells the whole story)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any, Protocol

from common.core.errors import ResponseCode
from common.format.protocol import Request, RequestCode, Response

_new_tuple = tuple.__new__


def reply(
    req: Request,
    code: ResponseCode = ResponseCode.SUCCESS,
    remark: str = "",
    fields: dict[str, Any] | None = None,
    bodies: list[bytes] | None = None,
) -> Response:
    # tuple.__new__ with every field: a NamedTuple's __new__ is a Python function (per answer)
    return _new_tuple(Response, (code, req.opaque, remark, fields or {}, bodies or []))


class Deferred:
    """A request a processor holds to answer later on the I/O thread (no Future, no thread hop).

    The processor registers it with its ``owner`` before returning it; the server stamps who
    asked (``identity``, ``code``, ``started``) and counts it in flight; ``owner.poll`` later hands
    it back with its ``Response``. Only the I/O thread touches a Deferred's fields."""

    __slots__ = ("code", "identity", "owner", "run", "run_messages", "started")

    def __init__(self, owner: LoopWaits) -> None:
        self.owner = owner
        self.identity = b""
        self.code = RequestCode.SEND
        self.started = 0.0
        # a run of the native put path's answers held together (master/put_path.py): their
        # (identity, ZMTP bytes), final once its owner hands it back, and the messages stored
        self.run: list[tuple[bytes, bytes]] | None = None
        self.run_messages = 0


Answers = list[tuple[Deferred, Response]]


class LoopWaits(Protocol):
    """The owner of Deferreds (``master/group_transfer.py``). Every method runs on the I/O thread;
    ``bind`` hands over ``wake(owner)``, which any thread may call so that ``poll`` runs soon."""

    @property
    def pending(self) -> int: ...  # Deferreds held, answered by no poll yet

    def bind(self, wake: Callable[[LoopWaits], None]) -> None: ...

    def poll(self) -> Answers: ...  # what reports and passed deadlines settled

    def timeout_ms(self) -> int | None: ...  # until the next deadline (None: none)

    def release_all(self) -> Answers: ...  # the loop ends: answer everything held


Reply = Response | concurrent.futures.Future | Deferred  # a Future resolves to a Response
