"""The promotion record (common/ha/promotion.py): its file and when a restart resumes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.ha import promotion
from common.ha.promotion import Promotion, PromotionRecordError, resumed_role

pytestmark = pytest.mark.unit

REC = Promotion("SYNC_MASTER", 257, "SLAVE", "10.0.0.1:10912", 1)


def test_the_record_round_trips_through_its_file(tmp_path: Path) -> None:
    assert promotion.load(tmp_path) is None
    written = promotion.record(tmp_path, "ASYNC_MASTER", 513, "SLAVE", "h:1")
    assert promotion.load(tmp_path) == written
    assert (written.role, written.epoch, written.configured_master) == ("ASYNC_MASTER", 513, "h:1")
    promotion.forget(tmp_path)
    promotion.forget(tmp_path)  # twice: nothing to remove is fine
    assert promotion.load(tmp_path) is None


def _doc(role: str, epoch: str) -> bytes:
    return (f'{{"brokerRole": "{role}", "epoch": {epoch}, "configuredRole": "SLAVE", '
            f'"configuredHaMasterAddress": "h:1"}}').encode()


@pytest.mark.parametrize("raw", [
    b"", b"\xff\xfe", b"[]", _doc("SLAVE", "1"), _doc("SYNC_MASTER", "0"),
    _doc("SYNC_MASTER", "true"), _doc("SYNC_MASTER", '"7"'),
    b'{"brokerRole": "SYNC_MASTER", "epoch": 3}', b"{" + b" " * 5000 + b"}",
])
def test_a_garbled_record_is_refused_with_a_reason(tmp_path: Path, raw: bytes) -> None:
    path = promotion.path_of(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(raw)
    with pytest.raises(PromotionRecordError):
        promotion.load(tmp_path)


def test_resumed_while_the_yaml_and_the_newest_epoch_are_unchanged() -> None:
    assert resumed_role(REC, "SLAVE", "10.0.0.1:10912", 257) == "SYNC_MASTER"
    assert resumed_role(None, "SLAVE", "10.0.0.1:10912", 257) is None
    assert resumed_role(REC, "SLAVE", "10.0.0.2:10912", 257) is None  # master edited
    assert resumed_role(REC, "ASYNC_MASTER", "10.0.0.1:10912", 257) is None  # role edited
    assert resumed_role(REC, "SLAVE", "10.0.0.1:10912", 258) is None  # a newer term copied
    assert resumed_role(REC, "SLAVE", "10.0.0.1:10912", 0) is None  # the history lost it
    # no groupServers: it could not find out whether another promotion replaced it since
    assert resumed_role(REC, "SLAVE", "10.0.0.1:10912", 257, can_probe=False) is None
