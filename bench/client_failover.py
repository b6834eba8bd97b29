"""How long sends in flight wait when their master dies: SIGKILL, restart, completion times.

    .venv/bin/python bench/client_failover.py [--rounds 3]

Each round starts an ASYNC_MASTER, keeps ``send_async`` sends flowing (at most 1000
outstanding) and a thread doing blocking ``send``s, SIGKILLs the broker and starts it again on
the same store and port. Printed per round: when the broker answered again, the slowest
completion of a ``send_async`` made in the second before the kill and of the blocking send in
progress at the kill (seconds after the kill), and the errors seen. The reference is the
client's ``timeout_ms`` (10 s): how long those sends waited before connection drops ended
them at once.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import _support

from common.client import DEFAULT_TIMEOUT_MS, Producer, SendResult


def one_round(home: Path) -> str:
    proc, address = _support.start_broker(home, brokerRole="ASYNC_MASTER")
    box: dict[str, subprocess.Popen[bytes]] = {"proc": proc}
    done = threading.Event()
    marks: dict[str, float] = {}
    blocking: list[tuple[float, float]] = []
    errors: list[str] = []
    try:
        with Producer([address]) as p:

            def sender() -> None:
                while not done.is_set():
                    t0 = time.monotonic()
                    try:
                        p.send("bench", b"b" * 100, queue_id=1)
                    except Exception as e:  # noqa: BLE001 - reported below
                        errors.append(f"send: {e}")
                    blocking.append((t0, time.monotonic()))

            thread = threading.Thread(target=sender)
            thread.start()
            futures: list[tuple[float, concurrent.futures.Future[SendResult]]] = []
            finished: dict[int, float] = {}  # id(future) -> when it completed
            stop_at = time.monotonic() + 1.0
            while time.monotonic() < stop_at:
                fut = p.send_async("bench", b"a" * 100, queue_id=0)
                fut.add_done_callback(lambda f: finished.__setitem__(id(f), time.monotonic()))
                futures.append((time.monotonic(), fut))
                while sum(1 for _, f in futures[-2000:] if not f.done()) > 1000:
                    time.sleep(0.001)
            box["proc"].send_signal(signal.SIGKILL)
            box["proc"].wait()
            marks["kill"] = time.monotonic()
            box["proc"] = _support.launch(home, address)
            marks["up"] = time.monotonic()
            ends: list[float] = []
            for t0, fut in futures:
                try:
                    fut.result(60)
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(f"send_async: {e}")
                if t0 >= marks["kill"] - 1.0:
                    ends.append(finished[id(fut)])
            done.set()
            thread.join(60)
        kill = marks["kill"]
        async_s = max(ends) - kill if ends else 0.0
        sync_s = max((end - kill for start, end in blocking if start <= kill <= end), default=0.0)
        return (
            f"broker up again {marks['up'] - kill:.2f} s after the kill; slowest send_async "
            f"{async_s:.2f} s, blocking send {sync_s:.2f} s after it; errors {len(errors)}"
            + (f" ({errors[0]})" if errors else "")
        )
    finally:
        box["proc"].kill()
        box["proc"].wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"client failover: reference timeout_ms {DEFAULT_TIMEOUT_MS / 1000:.0f} s")
    for n in range(args.rounds):
        home = Path(tempfile.mkdtemp(prefix="replog-bench-failover-"))
        try:
            print(f"  round {n + 1}: {one_round(home)}", flush=True)
        finally:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
