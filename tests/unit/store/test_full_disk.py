"""A full file system refuses writes with an error and the process keeps serving.

A store into a shared mapping whose page has no disk block is a SIGBUS that kills the broker;
every write path of the store must either write with ``pwrite`` (ENOSPC) or fault its pages in
first (``MADV_POPULATE_WRITE``, EFAULT) and refuse cleanly. Each test runs a script in a child
process on a 1 MiB tmpfs (root only), so a SIGBUS fails the test (status -7) instead of
killing pytest; each fails that way on the code before its fix.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common.store import native

REPO = Path(__file__).resolve().parents[3]

ROOT_ONLY = pytest.mark.skipif(
    sys.platform != "linux" or not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="mounts a small tmpfs (root)")


def _needs_populate() -> None:
    major, minor = (int(x) for x in re.findall(r"\d+", os.uname().release)[:2])
    if native._libc is None or (major, minor) < (5, 14):
        pytest.skip("needs MADV_POPULATE_WRITE (Linux 5.14): without it the store still faults")


# Fills what is left of the file system; ``free()`` gives it back.
FILL = """
import os
def fill(root):
    fd = os.open(root / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError:
        pass
    finally:
        os.close(fd)
def free(root):
    os.unlink(root / "filler")
"""


def _run_on_a_full_tmpfs(tmp_path: Path, script: str) -> str:
    """Run ``script`` in a child with a 1 MiB tmpfs as its argument; its stdout."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                      check=False, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        proc = subprocess.run([sys.executable, "-c", FILL + script, str(mnt)], cwd=REPO,
                              check=False, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
        return proc.stdout
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


ENOSPC_SCRIPT = """
import sys
from pathlib import Path
from common.store.commit_log import CommitLog
root = Path(sys.argv[1])
(root / "commitlog").mkdir()
log = CommitLog(root, 8 << 20, max_message_size=1 << 16)
offset = 0
try:
    while offset < 8 << 20:
        offset = log.append_replicated(offset, b"r" * 65536)
except OSError as e:
    print("refused", e.errno, offset, log.max_offset, flush=True)
    sys.exit(0)
print("no error", offset)
sys.exit(1)
"""


@ROOT_ONLY
def test_a_full_disk_refuses_replicated_bytes_without_killing_the_process(tmp_path: Path) -> None:
    """On a full file system a store into a mapping is a SIGBUS; a slave's append is an
    ENOSPC OSError, and the log keeps exactly what was written."""
    word, err, offset, max_offset = _run_on_a_full_tmpfs(tmp_path, ENOSPC_SCRIPT).split()
    assert word == "refused" and int(err) == 28  # ENOSPC
    assert int(offset) == int(max_offset) and 0 < int(offset) <= 1 << 20


PUT_ENOSPC_SCRIPT = """
import sys
from pathlib import Path
from common.core.message import Message
from common.store.commit_log import CommitLog
root = Path(sys.argv[1])
(root / "commitlog").mkdir()
log = CommitLog(root, 8 << 20, max_message_size=1 << 16)
puts = 0
while puts < 1000:
    r = log.put(Message("t", b"m" * 8000), 0)
    if r.status.name != "PUT_OK":
        break
    puts += 1
before = log.max_offset
again = log.put(Message("t", b"m" * 8000), 0)  # still refused, and still nothing changed
print(r.status.name, again.status.name, puts, before, log.max_offset,
      log.topic_queue_table[("t", 0)], flush=True)
"""


@ROOT_ONLY
def test_a_full_disk_refuses_puts_without_killing_the_process(tmp_path: Path) -> None:
    """A put into pages nobody faulted in ahead faults them in first; on a full file system
    that is refused (SERVICE_NOT_AVAILABLE) and the log is unchanged, where the copy into the
    mapping would have been a SIGBUS."""
    _needs_populate()
    out = _run_on_a_full_tmpfs(tmp_path, PUT_ENOSPC_SCRIPT)
    status, again, puts, before, after, queue_offset = out.split()
    assert status == again == "SERVICE_NOT_AVAILABLE"
    assert 0 < int(puts) < 1000 and int(before) == int(after)
    assert int(queue_offset) == int(puts)  # refused puts took no queue offset


CQ_SCRIPT = """
import sys
from pathlib import Path
from common.store.consume_queue import ConsumeQueue
root = Path(sys.argv[1])
cq = ConsumeQueue(root, "t", 0, 20 * 100_000)  # a sparse 2 MB file on a 1 MiB file system
n = 0
while n < 100:
    assert cq.put(n, n * 100, 100, 0)
    n += 1
fill(root)
while n < 100_000 and cq.put(n, n * 100, 100, 0):
    n += 1
refused_at, max_offset, error = n, cq.max_queue_offset, cq.last_error
again = cq.put_many(n, [(n * 100, 100, 0), (n * 100 + 100, 100, 0)])
free(root)
ok = cq.put_many(n, [(n * 100, 100, 0), (n * 100 + 100, 100, 0)])
print(refused_at, max_offset, again, cq.max_queue_offset, ok, cq.get(n), error.split(":")[-1])
"""


@ROOT_ONLY
def test_a_full_disk_refuses_consume_queue_entries_without_killing_the_process(
        tmp_path: Path) -> None:
    """A ConsumeQueue file is sparse: its next page gets a block when first written. On a
    full file system the entry is refused (False, with the reason) and nothing changes; once
    there is space again the same entries go in."""
    _needs_populate()
    out = _run_on_a_full_tmpfs(tmp_path, CQ_SCRIPT).split(maxsplit=6)
    refused_at, max_offset = int(out[0]), int(out[1])
    assert 100 < refused_at < 100_000 and max_offset == refused_at
    assert out[2] == "False" and out[3] == str(refused_at + 2) and out[4] == "True"
    assert out[5] == f"({refused_at * 100},", out  # the entry at the refused offset is there now
    assert "no space" in out[6]


INDEX_SCRIPT = """
import sys
from pathlib import Path
from common.store.index import IndexFile
root = Path(sys.argv[1])
f = IndexFile(root / "20260101000000000", 1000, 200_000, create=True)  # sparse, 4 MB
n = 0
fill(root)
try:
    while n < 199_000:
        assert f.put_key(n * 7919, n * 100, 1_700_000_000_000 + n)
        n += 1
except OSError as e:
    refused, count, end = e.errno, f.index_count, f.end_phy_offset
free(root)
assert f.put_key(n * 7919, n * 100, 1_700_000_000_000 + n)
print(n, refused, count, end, f.index_count, f.entry(n + 1)[1])
"""


@ROOT_ONLY
def test_a_full_disk_refuses_index_keys_without_killing_the_process(tmp_path: Path) -> None:
    """An index file is sparse too: the header and hash slots are made writable when it is
    created, each entry page before the key that needs it. A key that finds no space is an
    ENOSPC OSError with nothing written; the next key after space returns goes in."""
    _needs_populate()
    n, err, count, end, count_after, phy = (
        int(x) for x in _run_on_a_full_tmpfs(tmp_path, INDEX_SCRIPT).split())
    assert err == 28 and 0 < n < 199_000
    assert count == n + 1 and end == (n - 1) * 100  # the refused key left no trace
    assert count_after == n + 2 and phy == n * 100


STORE_SCRIPT = """
import sys, time
from pathlib import Path
from common.core.config import load_config
from common.core.message import Message
from common.store.message_store import MessageStore
root = Path(sys.argv[1])
cfg = load_config(None, (), env={}, storePathRootDir=str(root / "store"),
                  mappedFileSizeCommitLog=256 * 1024, mappedFileSizeConsumeQueue=20 * 100_000,
                  cleanResourceInterval=3_600_000)
store = MessageStore(cfg)
store.start()
try:
    assert store.put(Message("t", b"first"), 0).status.name == "PUT_OK"
    fill(root)
    put = store.put(Message("t", b"to a queue with no file yet"), 1)
    time.sleep(1.5)  # the reput thread tries, fails, and waits to retry
    before = store.get_message("g", "t", 1, 0, 8).status.name
    free(root)
    deadline = time.monotonic() + 10
    while store.get_message("g", "t", 1, 0, 8).status.name != "FOUND":
        assert time.monotonic() < deadline, "reput did not resume"
        time.sleep(0.05)
    got = store.get_message("g", "t", 1, 0, 8).messages()[0].body.decode()
    print(put.status.name, before, got.replace(" ", "_"))
finally:
    store.shutdown()
"""


@ROOT_ONLY
def test_reput_waits_out_a_full_disk_and_resumes(tmp_path: Path) -> None:
    """A message the CommitLog took but whose new ConsumeQueue file finds no space is not
    visible yet; reput logs the stall, keeps the broker alive and retries, and the message
    appears once there is space again."""
    _needs_populate()
    put, before, got = _run_on_a_full_tmpfs(tmp_path, STORE_SCRIPT).split()
    assert put == "PUT_OK"
    assert before != "FOUND"
    assert got == "to_a_queue_with_no_file_yet"
