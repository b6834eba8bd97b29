"""The compose cluster, run for real (docs/operations.md "Run a cluster with Docker").

One cluster for the module (torn down when it ends, not left running under the rest of the
suite), in a compose project of its own (``replog-test-<pid>``): the wheels
(compose/build-wheels.sh), the broker image (``docker compose build``), then ``up --wait``
until every service is healthy. Teardown is ``down -v`` of the project, then a check that no
container, network or volume of it is left.

Without a Docker engine, Compose v2 or the base images these tests skip, saying what is
missing; with ``REPLOG_REQUIRE_DOCKER=1`` (``.ci/run`` sets it) they fail instead, so CI cannot
pass them by skipping. Timings (image build, start-up to healthy) go to
``build/compose-timings.json`` and the test output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose" / "docker-compose.yml"
REQUIRE_ENV = "REPLOG_REQUIRE_DOCKER"
BASE_IMAGES = ("python:3.11-slim", "zookeeper:3.8")
GROUP_A_PORTS = (10911, 10913, 10921, 10923, 10931, 10933, 8080)  # 8080: the console
GROUP_B_PORTS = (10941, 10943, 10951, 10953, 10961, 10963)
UP_TIMEOUT_S = 240
TIMINGS = REPO / "build" / "compose-timings.json"


def missing_or_fail(problem: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {problem}")
    pytest.skip(problem)


def run(*args: str, timeout_s: float = 300, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s, check=False, env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {done.returncode}:\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def docker_problem() -> str:
    """"" when a Docker engine, Compose v2 and the SDK are usable here, else what is missing."""
    if shutil.which("docker") is None:
        return "no docker CLI (Debian: apt-get install docker.io)"
    try:
        import docker
    except ImportError:
        return "no Docker SDK for Python: pip install 'replog[drills]'"
    try:
        docker.from_env(timeout=10).ping()
    except docker.errors.DockerException as e:
        return f"the Docker engine does not answer ({e}): start dockerd"
    version = run("docker", "compose", "version", "--short", check=False, timeout_s=30)
    if version.returncode != 0 or not version.stdout.strip().lstrip("v").startswith("2"):
        return ("no Compose v2 (`docker compose version`): install it as a CLI plugin "
                "(docs/operations.md \"Run a cluster with Docker\")")
    if sys.version_info[:2] != (3, 11):
        return (f"compose/build-wheels.sh needs CPython 3.11 (the image's), this is "
                f"{sys.version_info[0]}.{sys.version_info[1]}")
    return ""


def base_images_problem() -> str:
    """Pull what is missing; "" when both base images are there."""
    absent = [i for i in BASE_IMAGES
              if run("docker", "image", "inspect", i, check=False, timeout_s=30).returncode]
    for image in absent:
        if run("docker", "pull", image, check=False, timeout_s=300).returncode == 0:
            absent.remove(image)
    if absent:
        return (f"no {' and '.join(absent)} and Docker Hub cannot be reached: as root, "
                "compose/offline-images.sh builds them from Debian packages")
    return ""


def busy_ports(ports: tuple[int, ...]) -> list[int]:
    busy = []
    for port in ports:
        with socket.socket() as s:
            # as a listener binds (docker-proxy does): connections of an earlier run left in
            # TIME_WAIT on the port do not keep it from listening
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    return busy


@dataclasses.dataclass
class ComposeCluster:
    project: str
    timings: dict[str, float]

    def compose(self, *args: str, timeout_s: float = 300,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        return run("docker", "compose", "-p", self.project, "-f", str(COMPOSE_FILE),
                   "--profile", "group-b", *args, timeout_s=timeout_s, check=check)

    def client(self) -> Any:
        import docker

        return docker.from_env(timeout=60)

    def container(self, service: str) -> Any:
        found = self.client().containers.list(all=True, filters={"label": [
            f"com.docker.compose.project={self.project}",
            f"com.docker.compose.service={service}"]})
        assert len(found) == 1, (service, found)
        return found[0]

    def record(self, **figures: Any) -> None:
        self.timings.update(figures)
        TIMINGS.parent.mkdir(parents=True, exist_ok=True)
        TIMINGS.write_text(json.dumps(self.timings, indent=2, sort_keys=True) + "\n")


def leftovers(project: str) -> dict[str, list[str]]:
    """Containers, networks and volumes of ``project`` still present."""
    import docker

    client = docker.from_env(timeout=60)
    label = {"label": [f"com.docker.compose.project={project}"]}
    return {
        "containers": [c.name for c in client.containers.list(all=True, filters=label)],
        "networks": [n.name for n in client.networks.list(filters=label)],
        "volumes": [v.name for v in client.volumes.list(filters=label)],
    }


@pytest.fixture(scope="module")
def compose_cluster() -> Iterator[ComposeCluster]:
    problem = docker_problem() or base_images_problem()
    if problem:
        missing_or_fail(problem)
    busy = busy_ports(GROUP_A_PORTS)
    if busy:
        pytest.fail(f"ports {busy} on 127.0.0.1 are taken (a compose cluster already up? "
                    "docker compose -f compose/docker-compose.yml down)")
    cluster = ComposeCluster(f"replog-test-{os.getpid()}", {})
    t0 = time.monotonic()
    run(str(REPO / "compose" / "build-wheels.sh"), timeout_s=600)
    t1 = time.monotonic()
    try:
        cluster.compose("build", "broker-a-1", timeout_s=600)
        t2 = time.monotonic()
        cluster.compose("up", "-d", "--wait", "--wait-timeout", str(UP_TIMEOUT_S),
                        "zk1", "zk2", "zk3", "broker-a-1", "broker-a-2", "broker-a-3",
                        "console", timeout_s=UP_TIMEOUT_S + 60)
        t3 = time.monotonic()
        cluster.record(wheels_s=round(t1 - t0, 1), image_build_s=round(t2 - t1, 1),
                       up_to_healthy_s=round(t3 - t2, 1))
        print(f"\n[compose] project {cluster.project}: wheels {t1 - t0:.1f} s, image build "
              f"{t2 - t1:.1f} s, up to all healthy {t3 - t2:.1f} s")
        yield cluster
    finally:
        logs = cluster.compose("logs", "--no-color", "--timestamps", check=False, timeout_s=60)
        (REPO / "build").mkdir(exist_ok=True)
        (REPO / "build" / "compose-logs.txt").write_text(logs.stdout + logs.stderr)
        cluster.compose("down", "-v", "--remove-orphans", "--timeout", "10", timeout_s=180)
        left = leftovers(cluster.project)
        assert not any(left.values()), f"left behind by down -v: {left}"
