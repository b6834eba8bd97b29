"""Controller-mode config keys: defaults, validation naming the key, the address format."""

from __future__ import annotations

import pytest

from common.core.config import load_config, parse_controller_addr
from common.core.errors import ConfigError

pytestmark = pytest.mark.unit

BASE = {"enableControllerMode": True, "controllerAddr": "127.0.0.1:2181", "brokerId": 1,
        "brokerRole": "SYNC_MASTER"}


def test_defaults_are_rocketmq_and_kazoo_ones() -> None:
    cfg = load_config(env={}, **BASE)
    assert cfg.controllerSessionTimeoutMs == 10_000 and cfg.controller_lease_ms == 5000
    assert cfg.haMaxTimeSlaveNotCatchup == 15_000 and not cfg.enableElectUncleanMaster
    assert cfg.brokerElectionPriority == 2**31 - 1
    assert not load_config(env={}).enableControllerMode  # off unless asked


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"controllerAddr": ""}, "controllerAddr"),
        ({"controllerAddr": "zk"}, "controllerAddr"),
        ({"controllerAddr": "zk:2181/"}, "controllerAddr"),
        ({"controllerAddr": "zk:2181/a//b"}, "controllerAddr"),
        ({"brokerRole": "SLAVE"}, "brokerRole"),
        ({"brokerId": 0}, "brokerId"),
        ({"controllerSessionTimeoutMs": 500}, "controllerSessionTimeoutMs"),
        ({"controllerLeaseMs": 7000}, "controllerLeaseMs"),
        ({"controllerLeaseMs": 50}, "controllerLeaseMs"),
        ({"controllerPollIntervalMs": 10}, "controllerPollIntervalMs"),
        ({"haMaxTimeSlaveNotCatchup": 1000, "slaveTimeout": 3000}, "haMaxTimeSlaveNotCatchup"),
        ({"switchoverTimeoutMs": 0}, "switchoverTimeoutMs"),
    ],
)
def test_bad_values_are_refused_naming_the_key(fields: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(env={}, **{**BASE, **fields})


def test_the_lease_must_end_well_before_the_session() -> None:
    assert load_config(env={}, **BASE, controllerSessionTimeoutMs=3000).controller_lease_ms \
        == 1500
    with pytest.raises(ConfigError, match="2/3"):
        load_config(env={}, **BASE, controllerSessionTimeoutMs=3000, controllerLeaseMs=2000)


def test_addresses_with_a_chroot() -> None:
    assert parse_controller_addr("a:1,b:2/replog/prod") == ("a:1,b:2", "/replog/prod")
    assert parse_controller_addr(" a:1 ") == ("a:1", "")
    cfg = load_config(env={"REPLOG_controllerAddr": "z:2181/x"}, **{
        k: v for k, v in BASE.items() if k != "controllerAddr"})
    assert cfg.controllerAddr == "z:2181/x"  # from the environment, as compose sets it
