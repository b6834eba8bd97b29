"""A broker process's memory as the tests that bound it mean it: its anonymous resident memory.

``VmRSS`` counts the pages of the CommitLog's mapped segments too, and those come and go
with the store's background work, not with what the broker keeps for a peer: the next
segment is prefaulted ahead of the writes, and a test that happened to span that saw VmRSS
grow 9-18 MB with nothing kept (seen as ``RSS grew 18.6 MB`` in
``test_fuzz_live_broker`` under load; /proc/PID/smaps put all of it on
``commitlog/00000000000033554432``). A message buffered by libzmq or by Python lives in
anonymous memory (the heaps, malloc's arenas and mmaps), which ``RssAnon`` counts alone.
"""

from __future__ import annotations

from pathlib import Path


def anon_rss(pid: int) -> int:
    """Bytes of anonymous resident memory of process ``pid`` (``RssAnon`` in its status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon in /proc/{pid}/status")
