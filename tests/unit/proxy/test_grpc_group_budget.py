"""The gRPC front end's clients made on a caller's behalf: any number of consumer-group names
cost no thread, socket or descriptor (one shared POP client, a view per group), and the views
kept are bounded."""

from __future__ import annotations

import os
import threading

import pytest
from helpers.brokers import free_port

from common.proxy import service as service_module
from common.proxy.service import MessagingService

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_new_group_names_make_no_client_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "GROUP_VIEWS", 16, raising=False)
    service = MessagingService([f"127.0.0.1:{free_port()}"], 1024, timeout_ms=500)
    try:
        threads, fds = threading.active_count(), _descriptors()
        views = [service._consumer(f"g{i}") for i in range(60)]
        assert threading.active_count() - threads <= 1
        assert _descriptors() - fds <= 2
        assert [v.group for v in views[:3]] == ["g0", "g1", "g2"]
        assert len({id(v._transport) for v in views}) == 1  # one transport for every group
        assert len(service._consumers) == 16  # the least recently used forgotten
        assert service._consumer("g59") is views[59]  # a kept view is reused
        assert service._consumer("g0").group == "g0"  # a forgotten one made again
    finally:
        service.close()
