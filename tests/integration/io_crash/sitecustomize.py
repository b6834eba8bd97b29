"""Kills a broker's request I/O thread on demand (``tests/integration/test_io_thread_death.py``).

On ``PYTHONPATH`` of one broker process only: once the file named by ``TEST_IO_CRASH_FILE``
exists, the request server's loop raises from ``_poll_timeout_ms`` (called on every pass), as a
bug in the loop would. Nothing else changes. The test checks first that the name still exists
(Python would only print "Error in sitecustomize" and go on), so a rename fails it at once
instead of leaving it to wait out a crash that never comes.
"""

from __future__ import annotations

import os

_FLAG = os.environ.get("TEST_IO_CRASH_FILE", "")

if _FLAG:
    from common.broker import server as _server

    _poll_timeout_ms = _server.RequestServer._poll_timeout_ms

    def _crashing(self):  # type: ignore[no-untyped-def]
        if os.path.exists(_FLAG):
            raise RuntimeError("injected: a bug in the request loop")
        return _poll_timeout_ms(self)

    _server.RequestServer._poll_timeout_ms = _crashing  # type: ignore[method-assign]
