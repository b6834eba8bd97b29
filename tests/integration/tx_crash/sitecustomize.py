"""Kills a broker in the middle of a transaction's end, on demand
(``tests/integration/test_transaction_failover.py``).

On ``PYTHONPATH`` of the drill's brokers: ``TEST_TX_CRASH_DIR`` names a directory where the
drill drops a flag file; the broker that takes the next end removes it and dies so:

* ``at-end``: SIGKILL as the END arrives (its half stored and replicated, no end written);
* ``after-commit``: the commit is written, its op is not: from then on this broker refuses
  every op record (an END retried meanwhile writes nothing more) and is SIGKILLed 0.5 s later,
  once the commit had time to reach the other members.

The drill checks first that ``TransactionStore.end`` still exists (Python would only print
"Error in sitecustomize" and go on).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

_DIR = os.environ.get("TEST_TX_CRASH_DIR", "")


def _take(name: str) -> bool:
    try:
        (Path(_DIR) / name).unlink()
    except FileNotFoundError:
        return False
    return True


def _die_later(seconds: float) -> None:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGKILL))
    timer.daemon = True
    timer.start()


if _DIR:
    from common.core.errors import PutStatus
    from common.core.transaction import OP_TOPIC, TransactionState
    from common.store.commit_log import refused
    from common.store.transaction import service as _service

    _end = _service.TransactionStore.end

    def _faulty_end(self, half, state, born_host):  # type: ignore[no-untyped-def]
        if _take("at-end"):
            os.kill(os.getpid(), signal.SIGKILL)
        if state is TransactionState.COMMIT and _take("after-commit"):
            store = self.store
            put = store.put_nowait

            def no_ops(msg, *args, **kwargs):  # type: ignore[no-untyped-def]
                if msg.topic == OP_TOPIC:
                    return store._pending(refused(PutStatus.SERVICE_NOT_AVAILABLE,
                                                  "injected: dying after the commit"), False)
                return put(msg, *args, **kwargs)

            store.put_nowait = no_ops
            _die_later(0.5)
        return _end(self, half, state, born_host)

    _service.TransactionStore.end = _faulty_end  # type: ignore[method-assign]
