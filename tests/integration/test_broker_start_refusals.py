"""A broker whose small state files are damaged refuses to start with one clear line naming the
file, exits 1 at once, and leaves its store as a clean shutdown would (no abort file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from broker_harness import REPO, BrokerProcess, brokers

from common.client import Producer
from common.core.errors import SendStatus

pytestmark = pytest.mark.integration

GARBAGE = b"\xff\x00 not json, not an epoch file \x80"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("damaged", "content"),
    [
        ("config/consumerOffset.json", GARBAGE),
        ("config/topics.json", GARBAGE),
        ("epochFileCheckpoint", GARBAGE),
        # valid JSON of the wrong shape (found by an audit: these were taken as empty tables,
        # or raised a bare TypeError)
        ("config/consumerOffset.json", b"null"),
        ("config/topics.json", b'{"topicConfigTable": []}'),
        ("config/delayOffset.json", b'{"offsetTable": {"1": null}}'),
        ("config/delayOffset.json", b'{"offsetTable": {"1": [3]}}'),
        # taken as absent, it stopped the CRC being required of every record written
        ("config/recordCrc.json", b'{"since": "soon"}'),
        ("config/recordCrc.json", GARBAGE),
    ],
)
def test_damaged_state_file_is_refused_clearly(tmp_path: Path, damaged: str,
                                               content: bytes) -> None:
    broker = BrokerProcess(tmp_path / "b", brokerRole="ASYNC_MASTER")
    with brokers(broker), Producer([broker.address]) as p:
        assert p.send("t", b"kept").status is SendStatus.SEND_OK
        p.queue_nums("t")  # topics.json now exists
        assert broker.terminate() == 0  # a clean stop: no abort file
    assert not (broker.store_root / "abort").exists()
    path = broker.store_root / damaged
    good = path.read_bytes() if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    config = broker.config_path
    done = subprocess.run([sys.executable, "-m", "common.cli", "broker", "-c", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr[-2000:]
    line = [x for x in done.stderr.splitlines() if "cannot start" in x]
    assert line and (path.name in line[0] or "epoch" in line[0]), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not (broker.store_root / "abort").exists()
    if good is not None:
        path.write_bytes(good)
    else:
        path.unlink()
    with brokers(broker), Producer([broker.address]) as p:
        assert p.send("t", b"after").status is SendStatus.SEND_OK


@pytest.mark.timeout(60)
def test_a_config_file_of_binary_garbage_is_bad_usage(tmp_path: Path) -> None:
    config = tmp_path / "b.yaml"
    config.write_bytes(b"\xff\xfe\x00garbage")
    done = subprocess.run([sys.executable, "-m", "common.cli", "broker", "-c", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cannot read config file" in done.stderr and str(config) in done.stderr
    assert "Traceback" not in done.stderr
