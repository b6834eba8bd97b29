"""A local ZooKeeper server as a child process: what ``replog cluster up`` (so ``make run``)
runs the controller on, and what the tests start (standalone, or the nodes of an ensemble).

It runs Debian's package (``apt-get install zookeeper``: the jars under /usr/share/java) on the
machine's Java 17: ``java -cp ... ZooKeeperServerMain zoo.cfg`` for one node,
``QuorumPeerMain`` for a member of an ensemble, each with its own data directory, on
127.0.0.1 only. ``tickTime`` bounds the session timeouts the server grants (2 to 20 ticks).
A node is ready when it answers the ``srvr`` four-letter word with its mode (standalone,
leader or follower), the one word ZooKeeper 3.8 allows without a whitelist.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from common.core import ports

JARS = ("/usr/share/java/zookeeper.jar",)  # its manifest names the jars it needs
OPTIONAL_JARS = ("/usr/share/java/slf4j-simple.jar",)  # server log lines, when present
CONF_DIR = "/etc/zookeeper/conf"
INSTALL_HINT = ("ZooKeeper is not installed: as root, `apt-get install -y zookeeper` (Debian's "
                "package; it runs on the machine's Java 17), or run the group without the "
                "controller: `replog cluster up --no-controller`")


def missing() -> str:
    """"" when a local ZooKeeper can run here, else what is missing and how to get it."""
    if shutil.which("java") is None:
        return "no `java` on PATH: install OpenJDK 17 (Debian: openjdk-17-jre-headless)"
    if not Path(JARS[0]).exists():
        return INSTALL_HINT
    return ""


def classpath() -> str:
    jars = [j for j in (*JARS, *OPTIONAL_JARS) if Path(j).exists()]
    if Path(CONF_DIR).is_dir():
        jars.insert(0, CONF_DIR)
    return ":".join(jars)


def free_port() -> int:
    """A free port below the kernel's ephemeral range (one the kernel hands an outgoing
    connection meanwhile cannot be taken from under the server)."""
    return ports.free_port()


def mode_of(port: int, timeout_s: float = 1.0) -> str:
    """The node's mode (standalone, leader, follower) from ``srvr``; "" if it does not serve."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(b"srvr")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
    except OSError:
        return ""
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return ""


class ZooKeeperNode:
    """One ZooKeeper server process. ``peers``: (id, client port, quorum port, election port)
    of every node of an ensemble, this one included; empty for a standalone server."""

    def __init__(self, directory: Path, client_port: int, tick_ms: int = 500,
                 my_id: int = 0, peers: list[tuple[int, int, int, int]] | None = None):
        self.directory = Path(directory).resolve()
        self.client_port = client_port
        self.tick_ms = tick_ms
        self.my_id = my_id
        self.peers = list(peers or [])
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.directory / "zookeeper.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def write_config(self) -> Path:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={self.tick_ms}",
            "initLimit=10",
            "syncLimit=5",
            f"dataDir={data}",
            f"clientPort={self.client_port}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            "maxClientCnxns=0",
            # a dead peer's address is not waited on for the default 5 s
            "cnxTimeout=1000",
        ]
        for node_id, _client, quorum, election in self.peers:
            lines.append(f"server.{node_id}=127.0.0.1:{quorum}:{election}")
        if self.peers:
            (data / "myid").write_text(f"{self.my_id}\n")
        cfg = self.directory / "zoo.cfg"
        cfg.write_text("\n".join(lines) + "\n")
        return cfg

    def start(self, prefix: Sequence[str] = ()) -> ZooKeeperNode:
        """``prefix``: what runs the JVM (``setpriv --pdeathsig TERM --``: it ends with its
        parent)."""
        problem = missing()
        if problem:
            raise RuntimeError(problem)
        cfg = self.write_config()
        main = ("org.apache.zookeeper.server.quorum.QuorumPeerMain" if self.peers
                else "org.apache.zookeeper.server.ZooKeeperServerMain")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*prefix, "java", "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC",
                 f"-Dzookeeper.cnxTimeout={1000}", "-cp", classpath(), main, str(cfg)],
                cwd=self.directory, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> str:
        """Wait (bounded) until it serves; its mode."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self.process.returncode}; see "
                                   f"{self.log_path}")
            mode = mode_of(self.client_port, 0.5)
            if mode:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"ZooKeeper exited with {self.process.returncode} while "
                                       f"another server answers on {self.address}; see "
                                       f"{self.log_path}")
                return mode
            if time.monotonic() > deadline:
                raise RuntimeError(f"ZooKeeper on {self.address} not serving after "
                                   f"{timeout_s:.0f} s; see {self.log_path}")
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; reaped either way."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def kill(self) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)


class Ensemble:
    """``size`` ZooKeeper nodes on 127.0.0.1 (one: a standalone server)."""

    def __init__(self, directory: Path, size: int = 1, tick_ms: int = 500,
                 base_port: int | None = None):
        ports = [(base_port + i if base_port else free_port(), free_port(), free_port())
                 for i in range(size)]
        peers = [(i + 1, c, q, e) for i, (c, q, e) in enumerate(ports)] if size > 1 else []
        self.nodes = [
            ZooKeeperNode(Path(directory) / f"zk-{i + 1}", ports[i][0], tick_ms, i + 1, peers)
            for i in range(size)
        ]

    @property
    def hosts(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def start(self, timeout_s: float = 60.0) -> Ensemble:
        for node in self.nodes:
            node.start()
        return self.start_waiting(timeout_s)

    def start_waiting(self, timeout_s: float = 60.0) -> Ensemble:
        """Wait (bounded) until every started node serves."""
        for node in self.nodes:
            node.wait_ready(timeout_s)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()
