"""Skews a broker's wall clock by ``DRILL_CLOCK_SKEW_S`` seconds (docs/drills.md row 15).

On ``PYTHONPATH`` of one broker process only, the way libfaketime would be ``LD_PRELOAD``ed on
it, without needing libfaketime on the machine: ``time.time``, ``time.time_ns`` and
``datetime.datetime.now`` run ahead (or behind). Monotonic clocks are left alone, as a skewed
machine's are: the drill checks that nothing of replog's safety hangs on the wall clock.
"""

from __future__ import annotations

import datetime
import os
import time

_SKEW_S = float(os.environ.get("DRILL_CLOCK_SKEW_S", "0") or 0)

if _SKEW_S:
    _time, _time_ns = time.time, time.time_ns
    _skew_ns = int(_SKEW_S * 1e9)

    def _skewed_time() -> float:
        return _time() + _SKEW_S

    def _skewed_time_ns() -> int:
        return _time_ns() + _skew_ns

    class _SkewedDatetime(datetime.datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def,override]
            return super().now(tz) + datetime.timedelta(seconds=_SKEW_S)

    time.time = _skewed_time
    time.time_ns = _skewed_time_ns
    datetime.datetime = _SkewedDatetime  # type: ignore[misc]
