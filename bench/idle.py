"""What an idle broker costs: the CPU (utime + stime from /proc) of one ASYNC_MASTER broker
process that nobody talks to, over ``WINDOW_S`` after it settled, as a share of one core.

Every background thread of a broker (flush, reput, timer, transaction check, POP revive,
housekeeping, HA) wakes on its own timer; this figure is what they cost together when there is
nothing to do, which every broker pays all the time.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))
import _support
from cluster import cpu_seconds

WINDOW_S = float(os.environ.get("REPLOG_BENCH_IDLE_WINDOW_S", "20"))
SETTLE_S = 3.0


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="replog-bench-idle-"))
    broker, _address = _support.start_broker(
        home, brokerRole="ASYNC_MASTER", flushDiskType="ASYNC_FLUSH",
        mappedFileSizeCommitLog=64 * 1024 * 1024)
    try:
        time.sleep(SETTLE_S)
        before = cpu_seconds(broker.pid)
        time.sleep(WINDOW_S)
        used = cpu_seconds(broker.pid) - before
        print(f"idle broker (ASYNC_MASTER, no client, {WINDOW_S:.0f} s after {SETTLE_S:.0f} s "
              f"to settle, {os.cpu_count()} CPUs): {used / WINDOW_S * 100:.2f}% of a core "
              f"({used * 1000 / WINDOW_S:.1f} ms of CPU a second)")
        return 0
    finally:
        _support.stop(broker)


if __name__ == "__main__":
    sys.exit(main())
