"""A slave holds its HA listen port from start, so that a promotion can bind it.

RocketMQ's slaves listen on ``haListenPort`` from start. Our HA service binds the port only
when the broker becomes a master; until then another program, or the ephemeral port of any
outgoing connection (Linux picks those from 32768-60999, where free ports are found too), could
take it, and the promotion would fail to bind. A drill saw exactly that: a slave promoted after
two seconds of client traffic answered "HA service cannot bind ...: Address already in use".

The hold is a listening TCP socket on the port. Nothing else can bind a port with a listener,
connect() never picks it as an ephemeral port, and ``SO_REUSEADDR`` (as ZeroMQ's own bind sets)
lets it start while connections of an earlier life of this broker are in TIME_WAIT. A peer that
connects meanwhile waits in the backlog and is reset when the hold is released; the master's
ROUTER binds the port right after ``release``.
"""

from __future__ import annotations

import socket


class PortHold:
    def __init__(self, host: str, port: int):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(1)
        except OSError as e:
            sock.close()
            raise OSError(e.errno, f"haListenPort {port} is in use: {e.strerror}") from e
        self.port = port
        self._sock: socket.socket | None = sock

    @property
    def held(self) -> bool:
        return self._sock is not None

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
