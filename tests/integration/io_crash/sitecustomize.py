"""Kills a broker's request I/O thread on demand (``tests/integration/test_io_thread_death.py``).

On ``PYTHONPATH`` of one broker process only: once the file named by ``TEST_IO_CRASH_FILE``
exists, the request server's loop raises from ``_expire_polls`` (called on every pass), as a
bug in the loop would. Nothing else changes.
"""

from __future__ import annotations

import os

_FLAG = os.environ.get("TEST_IO_CRASH_FILE", "")

if _FLAG:
    from common.broker import server as _server

    _expire_polls = _server.RequestServer._expire_polls

    def _crashing(self, sock, now):  # type: ignore[no-untyped-def]
        if os.path.exists(_FLAG):
            raise RuntimeError("injected: a bug in the request loop")
        return _expire_polls(self, sock, now)

    _server.RequestServer._expire_polls = _crashing  # type: ignore[method-assign]
