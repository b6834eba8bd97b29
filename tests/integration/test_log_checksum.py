"""LOG_CHECKSUM (docs/protocol.md): each broker hashes a CommitLog range of its own, so replicas
are compared without reading their files (the docker drill's final check). The answer is the
sha256 of exactly the bytes the segment files hold, segment padding included; it is equal on
a master and its slave, differs between logs that differ, and a range the broker does not
hold, a reversed one or one over the per-request bound is refused naming why."""

from __future__ import annotations

import hashlib
import itertools
import random
from pathlib import Path

import pytest
from broker_harness import BrokerProcess, brokers
from replication_harness import (
    SEGMENT_BYTES,
    commitlog_digest,
    master_and_slave,
    wait_converged,
    wait_in_sync,
)

from common.client import Admin, Producer, Transport
from common.client import admin as admin_module
from common.core.errors import BrokerError, ResponseCode, SendStatus
from common.format.protocol import LOG_CHECKSUM_MAX_BYTES, RequestCode

pytestmark = pytest.mark.integration


def fill(address: str, total_bytes: int, seed: int) -> None:
    rng = random.Random(seed)
    with Producer([address], timeout_ms=10_000) as p:
        sent = 0
        while sent < total_bytes:
            bodies = [rng.randbytes(rng.randint(100, 3000)) for _ in range(32)]
            results = p.send_batch("t", bodies, queue_id=rng.randrange(4))
            assert all(r.status == SendStatus.SEND_OK for r in results)
            sent += sum(len(b) for b in bodies)


@pytest.mark.timeout(180)
def test_replicas_report_the_checksum_of_their_files(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    master, slave = master_and_slave(tmp_path, "SYNC_MASTER")
    with brokers(master, slave):
        wait_in_sync(master)
        fill(master.address, 3 * SEGMENT_BYTES + SEGMENT_BYTES // 3, seed=1)
        end = wait_converged(master, slave)
        low = master.status()["minPhyOffset"]
        assert end > 3 * SEGMENT_BYTES
        ranges = [(low, end),  # every segment, the last one partly written
                  (SEGMENT_BYTES - 5000, SEGMENT_BYTES + 7000),  # across a segment's padding
                  (12_345, 12_345 + 100), (end, end)]
        with Admin([master.address], timeout_ms=10_000) as admin:
            for lo, hi in ranges:
                on_disk = commitlog_digest(master.store_root, lo, hi, SEGMENT_BYTES)
                assert commitlog_digest(slave.store_root, lo, hi, SEGMENT_BYTES) == on_disk
                assert admin.log_checksum(master.address, lo, hi) == on_disk, (lo, hi)
                assert admin.log_checksum(slave.address, lo, hi) == on_disk, (lo, hi)
            assert admin.log_checksum(master.address, low, end - 1) != \
                admin.log_checksum(master.address, low, end)
            # a range longer than one request: the sha256 of the pieces' digests, in order
            piece = SEGMENT_BYTES // 2 + 7
            monkeypatch.setattr(admin_module, "LOG_CHECKSUM_MAX_BYTES", piece)
            cuts = [*range(low, end, piece), end]
            expected = hashlib.sha256(b"".join(
                bytes.fromhex(commitlog_digest(slave.store_root, a, b, SEGMENT_BYTES))
                for a, b in itertools.pairwise(cuts))).hexdigest()
            assert admin.log_checksum(slave.address, low, end) == expected
            assert admin.log_checksum(master.address, low, end) == expected
            monkeypatch.undo()
            with pytest.raises(BrokerError) as caught:
                admin.log_checksum(slave.address, low, end + 1)
            assert caught.value.code == ResponseCode.OFFSET_OUT_OF_RANGE
            assert f"[{low}, {end})" in caught.value.remark
            with pytest.raises(BrokerError) as caught:
                admin.log_checksum(slave.address, 10, 5)
            assert caught.value.code == ResponseCode.BAD_REQUEST
        transport = Transport(name="checksum-test")
        try:
            for fields, field in (({"fromOffset": 0, "toOffset": LOG_CHECKSUM_MAX_BYTES + 1},
                                   "toOffset"),
                                  ({"fromOffset": 9, "toOffset": 8}, "toOffset"),
                                  ({"fromOffset": -1, "toOffset": 8}, "fromOffset")):
                resp = transport.call_sync(master.address, RequestCode.LOG_CHECKSUM, fields,
                                           (), 5000)
                assert resp.code == ResponseCode.BAD_REQUEST and field in resp.remark, resp
        finally:
            transport.close()


@pytest.mark.timeout(120)
def test_logs_that_differ_report_different_checksums(tmp_path: Path) -> None:
    a = BrokerProcess(tmp_path / "a", brokerRole="ASYNC_MASTER")
    b = BrokerProcess(tmp_path / "b", brokerRole="ASYNC_MASTER")
    with brokers(a, b):
        fill(a.address, 200_000, seed=2)
        fill(b.address, 200_000, seed=3)
        with Admin([a.address], timeout_ms=10_000) as admin:
            hi = min(admin.status(a.address)["maxPhyOffset"],
                     admin.status(b.address)["maxPhyOffset"])
            assert admin.log_checksum(a.address, 0, hi) != admin.log_checksum(b.address, 0, hi)
            assert admin.log_checksum(a.address, 0, 0) == hashlib.sha256().hexdigest()
