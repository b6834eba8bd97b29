"""The docker-compose deployment, validated without a Docker engine.

Every service's broker config is loaded through ``common.core.config`` exactly as the container
would (YAML file + REPLOG_ environment), so a misspelt key or a wrong role fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from common.core.config import load_config

pytestmark = pytest.mark.unit

COMPOSE = Path(__file__).resolve().parents[2] / "compose"


def services() -> dict[str, dict]:
    doc = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    return doc["services"]


def broker_config(name: str, svc: dict):
    conf = next(v.split(":")[0] for v in svc["volumes"] if v.endswith("/etc/replog/broker.yaml:ro"))
    return load_config(COMPOSE / conf, env={f"{k}": str(v) for k, v in svc["environment"].items()})


def test_every_service_config_loads_with_its_environment() -> None:
    for name, svc in services().items():
        cfg = broker_config(name, svc)
        assert cfg.brokerIP1 == name == svc["hostname"]
        assert cfg.storePathRootDir.startswith("/data")
        assert any(v.endswith(":/data") for v in svc["volumes"])


def test_group_has_one_master_and_slaves_pointing_at_it() -> None:
    cfgs = {name: broker_config(name, svc) for name, svc in services().items()}
    masters = [c for c in cfgs.values() if not c.is_slave]
    slaves = [c for c in cfgs.values() if c.is_slave]
    assert len(masters) == 1 and len(slaves) >= 1
    master = masters[0]
    assert len({c.brokerName for c in cfgs.values()}) == 1
    assert sorted(c.brokerId for c in cfgs.values()) == list(range(len(cfgs)))
    for s in slaves:
        assert s.haMasterAddress == f"{master.brokerIP1}:{master.ha_port}"


def test_host_ports_are_unique_and_map_the_client_port() -> None:
    seen: set[str] = set()
    for name, svc in services().items():
        cfg = broker_config(name, svc)
        host_ports = [p.split(":")[0] for p in svc["ports"]]
        assert not seen & set(host_ports)
        seen |= set(host_ports)
        assert any(p.endswith(f":{cfg.listenPort}") for p in svc["ports"])


def test_dockerfile_installs_the_package_and_runs_a_broker() -> None:
    text = (COMPOSE / "Dockerfile").read_text()
    for needed in ("ARG BASE=python:3.11-slim", "--no-index", "USER replog", "HEALTHCHECK",
                   'ENTRYPOINT ["replog"]'):
        assert needed in text
    for svc in services().values():
        assert svc["build"]["dockerfile"] == "compose/Dockerfile"
