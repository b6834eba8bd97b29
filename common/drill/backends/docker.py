"""The docker backend: faults on the compose project's containers through the Docker SDK
(``replog drill --backend docker``; the ``docker`` package is the ``drills`` extra and is
imported only here, when a docker drill runs).

It finds the project's containers by their labels (compose/docker-compose.yml):
``com.docker.compose.project`` and, on brokers, ``replog.role=broker``, ``replog.group``,
``replog.member-id`` and ``replog.listen-port`` (the client port, published on the host with
the same number). Faults:

    kill       ``docker kill`` (SIGKILL); ``start`` starts the same container again
    restart    ``docker stop`` (SIGTERM, SIGKILL after the grace period), then start
    pause      ``docker pause`` (the cgroup freezer: every thread stops, sockets stay open)
    partition  ``docker network disconnect`` of the broker from the project's ZooKeeper
               network (``control``: ZooKeeper and the brokers) or from its slaves' network
               (``data``: replication between brokers); ``heal`` connects it again with the
               aliases it had (brokerIP1 is an alias on ``data``). The host still reaches it
               through the third network (``front``) its published port rides on.
"""

from __future__ import annotations

import time
from typing import Any

from common.drill.backends import SLAVES_SIDE, ZOOKEEPER_SIDE, DrillError, DrillNode
from common.drill.workload import wait_for

STOP_TIMEOUT_S = 30  # as the compose file's stop_grace_period
INSTALL_HINT = ("the docker backend needs the Docker SDK for Python: pip install "
                "'replog[drills]' (the `drills` extra), or `make venv`")


def docker_module() -> Any:
    """The ``docker`` package, or DrillError saying how to install it."""
    try:
        import docker
    except ImportError:
        raise DrillError(INSTALL_HINT) from None
    return docker


def engine(timeout_s: int = 60) -> Any:
    """A Docker SDK client for the engine of this environment (DOCKER_HOST or the socket)."""
    docker = docker_module()
    try:
        client = docker.from_env(timeout=timeout_s)
        client.ping()
    except docker.errors.DockerException as e:
        raise DrillError(f"cannot reach the Docker engine ({e}): start dockerd, or set "
                         "DOCKER_HOST") from None
    return client


class DockerBackend:
    name = "docker"

    def __init__(self, project: str = "replog", group: str = "broker-a",
                 zookeeper_network: str = "control", data_network: str = "data",
                 client: Any = None):
        self.project = project
        self.group = group
        self.client = client if client is not None else engine()
        self._containers = self._brokers()
        self._networks = {ZOOKEEPER_SIDE: self._network(zookeeper_network),
                          SLAVES_SIDE: self._network(data_network)}
        self._nodes = [self._node(c) for c in self._containers.values()]
        self._paused: set[str] = set()
        self._down: set[str] = set()
        self._cut: dict[tuple[str, str], list[str]] = {}  # (node, side) -> its aliases there

    # ---- discovery ------------------------------------------------------------------------
    def _labels(self, *extra: str) -> dict[str, list[str]]:
        return {"label": [f"com.docker.compose.project={self.project}", *extra]}

    def _brokers(self) -> dict[str, Any]:
        found = self.client.containers.list(all=True, filters=self._labels(
            "replog.role=broker", f"replog.group={self.group}"))
        if not found:
            raise DrillError(f"no broker container of group {self.group} in compose project "
                             f"{self.project}: bring the cluster up first (docker compose -f "
                             "compose/docker-compose.yml up -d --wait)")
        by_name = {}
        for c in sorted(found, key=lambda c: int(c.labels.get("replog.member-id", "0"))):
            if c.status != "running":
                raise DrillError(f"{c.name} is {c.status}: every broker of the group must run "
                                 "before a drill (docker compose ... up -d --wait)")
            by_name[c.labels["com.docker.compose.service"]] = c
        return by_name

    def _network(self, key: str) -> Any:
        found = self.client.networks.list(filters=self._labels(f"com.docker.compose.network={key}"))
        if len(found) != 1:
            raise DrillError(f"compose project {self.project} has {len(found)} networks named "
                             f"{key!r}; the compose file defines `control` (ZooKeeper and the "
                             "brokers) and `data` (between brokers)")
        return found[0]

    def _node(self, container: Any) -> DrillNode:
        labels = container.labels
        try:
            member_id = int(labels["replog.member-id"])
            port = int(labels["replog.listen-port"])
        except (KeyError, ValueError):
            raise DrillError(f"{container.name} lacks the labels replog.member-id and "
                             "replog.listen-port") from None
        bindings = (container.attrs["NetworkSettings"]["Ports"] or {}).get(f"{port}/tcp") or []
        if not bindings:
            raise DrillError(f"{container.name} does not publish its client port {port} on "
                             "the host")
        host_ip = bindings[0].get("HostIp") or "127.0.0.1"
        if host_ip in ("0.0.0.0", "::"):
            host_ip = "127.0.0.1"
        service = labels["com.docker.compose.service"]
        return DrillNode(service, member_id, f"{host_ip}:{bindings[0]['HostPort']}", port)

    def nodes(self) -> list[DrillNode]:
        return list(self._nodes)

    def unsupported(self, fault: str) -> str:
        return ""

    def container(self, node: DrillNode) -> Any:
        return self._containers[node.name]

    # ---- faults ---------------------------------------------------------------------------
    def kill(self, node: DrillNode) -> None:
        c = self.container(node)
        c.kill(signal="SIGKILL")
        self._down.add(node.name)
        self._wait_state(c, "exited")

    def start(self, node: DrillNode) -> None:
        c = self.container(node)
        c.start()
        self._wait_state(c, "running")
        self._down.discard(node.name)

    def restart(self, node: DrillNode) -> None:
        c = self.container(node)
        self._down.add(node.name)
        c.stop(timeout=STOP_TIMEOUT_S)
        self.start(node)

    def pause(self, node: DrillNode) -> None:
        self.container(node).pause()
        self._paused.add(node.name)

    def resume(self, node: DrillNode) -> None:
        self.container(node).unpause()
        self._paused.discard(node.name)

    def partition(self, node: DrillNode, side: str) -> None:
        c = self.container(node)
        net = self._networks[side]
        c.reload()
        endpoint = c.attrs["NetworkSettings"]["Networks"].get(net.name)
        if endpoint is None:
            raise RuntimeError(f"{node.name} is not on network {net.name}")
        # compose's aliases (the service name; on `data` also brokerIP1) go with the endpoint:
        # connected again without them, the others could not resolve the broker's name
        aliases = [a for a in endpoint.get("Aliases") or [] if not c.id.startswith(a)]
        self._cut[(node.name, side)] = aliases
        net.disconnect(c)

    def heal(self, node: DrillNode, side: str) -> None:
        aliases = self._cut.pop((node.name, side))
        self._networks[side].connect(self.container(node), aliases=aliases)

    def heal_all(self) -> None:
        for name in sorted(self._paused):
            c = self._containers[name]
            c.reload()
            if c.status == "paused":
                c.unpause()
        self._paused.clear()
        for (name, side), aliases in sorted(self._cut.items()):
            self._networks[side].connect(self._containers[name], aliases=aliases)
        self._cut.clear()
        for name in sorted(self._down):
            c = self._containers[name]
            c.reload()
            if c.status != "running":
                c.start()
        self._down.clear()

    # ---- any service of the project (e.g. a ZooKeeper node) -------------------------------
    def service_container(self, service: str) -> Any:
        found = self.client.containers.list(all=True, filters=self._labels(
            f"com.docker.compose.service={service}"))
        if len(found) != 1:
            raise DrillError(f"compose project {self.project} has {len(found)} containers of "
                             f"service {service}")
        return found[0]

    def _wait_state(self, container: Any, state: str, timeout_s: float = 60.0) -> None:
        def reached() -> bool:
            container.reload()
            return bool(container.status == state)

        wait_for(reached, timeout_s, f"{container.name} to be {state}", step_s=0.1)

    def describe(self) -> dict[str, Any]:
        images = {c.image.tags[0] if c.image.tags else c.image.short_id
                  for c in self._containers.values()}
        return {"backend": self.name, "project": self.project, "group": self.group,
                "images": sorted(images),
                "networks": {side: n.name for side, n in self._networks.items()},
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
