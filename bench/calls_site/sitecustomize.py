"""Loaded by a broker that ``bench/calls_per_message.py`` starts (this directory first on its
PYTHONPATH, ``REPLOG_CALLS_OUT`` set): counts every Python function call and every call of a
C function from Python, on every thread, between SIGUSR1 (start) and SIGUSR2 (stop: the
counts go to ``REPLOG_CALLS_OUT`` as JSON ``[[thread, file, function, calls], ...]``). The counting
makes the broker several times slower; the counts do not depend on the machine's noise."""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import threading
from typing import Any

_on = False
_counts: collections.Counter[tuple[str, str, str]] = collections.Counter()


def _where(filename: str) -> str:
    parts = filename.replace(os.sep, "/").rsplit("/", 2)
    return "/".join(parts[-2:])


def _profile(frame: Any, event: str, arg: Any) -> None:
    if not _on:
        return
    if event == "call":
        code = frame.f_code
        _counts[(threading.current_thread().name, _where(code.co_filename), code.co_name)] += 1
    elif event == "c_call":
        _counts[(threading.current_thread().name, "C",
                 getattr(arg, "__qualname__", None) or repr(arg))] += 1


def _start(*_: object) -> None:
    global _on
    _counts.clear()
    _on = True


def _stop(*_: object) -> None:
    global _on
    _on = False
    with open(os.environ["REPLOG_CALLS_OUT"], "w") as f:
        json.dump([[*k, v] for k, v in _counts.items()], f)


if os.environ.get("REPLOG_CALLS_OUT"):
    threading.setprofile(_profile)
    sys.setprofile(_profile)
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
