"""``replog cluster up``: local broker groups as child processes (what ``make run`` runs).

One group by default (``broker-a``: broker *i* on base port P + 10i, under ``<dir>/broker-<i>``).
With ``--groups N`` (controller mode) groups ``broker-a``, ``broker-b``, ... share one local
ZooKeeper and one ``brokerClusterName``: group *g*'s broker *i* listens on P + 100g + 10i, under
``<dir>/broker-<letter>-<i>``; the first group's master keeps port P, ZooKeeper is on P + 90.

``--secure`` (docs/security.md): under ``--dir``, ``keys/broker.key(_secret)`` (the group's key
pair: every broker serves with it and pins it as its master's) and ``keys/admin.key(_secret)``
(the CLI's), and ``acl.yml`` with an ``admin`` account and a ``replica`` account for the
brokers; each is made only if missing, so a restarted cluster keeps its keys and an edited ACL.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

from rich.table import Table

from common.cli import zookeeper
from common.cli.console_child import ConsoleChild
from common.cli.output import EXIT_OK, UsageError, emit_json, err, out
from common.cli.zookeeper import Ensemble
from common.client import Admin
from common.core import ports
from common.core.config import KNOWN_KEYS, dump_yaml, load_config
from common.core.errors import BrokerError
from common.core.keys import load_public, new_key_pair

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
CLUSTER_SEGMENT_BYTES = 128 * 1024 * 1024
ZK_PORT_OFFSET = 90  # the local ZooKeeper's client port: base port + 90 (11001 by default)
CONSOLE_PORT_OFFSET = 88  # the web console: base port + 88 (10999 by default)
ZK_TICK_MS = 500  # sessions of 1..10 s
LOCAL_SESSION_MS = 4000  # a local group fails over in about this long (brokers default: 10 s)
GROUP_PORT_STRIDE = 100  # group g's brokers listen from base port + 100g
MAX_GROUPS = 26  # broker-a .. broker-z
CLUSTER_NAME = "DefaultCluster"


def group_name(index: int) -> str:
    return f"broker-{chr(ord('a') + index)}"


@dataclasses.dataclass
class ChildBroker:
    name: str
    role: str
    address: str
    config_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    group: str = "broker-a"  # its brokerName

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "role": self.role,
            "address": self.address,
            "pid": self.process.pid if self.process else None,
            "config": str(self.config_path),
            "log": str(self.log_path),
        }


class LocalCluster:
    """``groups`` x (1 master + N slaves) as child ``replog broker`` processes under one
    directory.

    With ``controller`` (the default of ``replog cluster up``) a local ZooKeeper runs as a
    child too (``common/cli/zookeeper.py``, Debian's package) and each group runs in controller
    mode: ZooKeeper elects its master (the first broker of the group, when all start together:
    the lowest member id wins a tie) and a new one when it dies, group by group. Without it,
    broker-0 is the master and a failover takes ``replog promote``; several groups need the
    controller (their routes are kept in ZooKeeper)."""

    def __init__(
        self, directory: Path, slaves: int = 2, mode: str = "sync", base_port: int = 10911,
        controller: bool = False, zk_port: int | None = None,
        session_ms: int = LOCAL_SESSION_MS, groups: int = 1,
        secure: bool = False, settings: dict[str, Any] | None = None,
    ):
        """``settings``: config keys every broker gets besides the cluster's own."""
        if not 1 <= groups <= MAX_GROUPS:
            raise UsageError(f"--groups must be 1..{MAX_GROUPS}, not {groups}")
        if groups > 1 and not controller:
            raise UsageError("several broker groups need the controller: their routes are kept "
                             "in ZooKeeper (drop --no-controller)")
        self.directory = directory.resolve()
        self.base_port = base_port
        self.size = slaves + 1
        self.groups = groups
        self.controller = controller
        self.zookeeper: Ensemble | None = None
        if controller:
            problem = zookeeper.missing()
            if problem:
                raise UsageError(problem)
            self.zookeeper = Ensemble(self.directory / "zookeeper", 1, ZK_TICK_MS,
                                      base_port=zk_port or base_port + ZK_PORT_OFFSET)
        self.session_ms = session_ms
        self.secure = secure
        self.settings = dict(settings or {})
        self.keys_dir = self.directory / "keys"
        self.acl_path = self.directory / "acl.yml"
        if secure:
            self._make_keys_and_acl()
        self.children = [self._child(i, mode, g) for g in range(groups)
                         for i in range(slaves + 1)]
        self.force_stop: Callable[[], bool] = lambda: False  # a second Ctrl-C: SIGKILL now

    @property
    def controller_addr(self) -> str:
        assert self.zookeeper is not None
        return f"{self.zookeeper.hosts}/replog-local"

    def _make_keys_and_acl(self) -> None:
        for name in ("broker", "admin"):
            if not (self.keys_dir / f"{name}.key_secret").exists():
                new_key_pair(self.keys_dir, name)
        if self.acl_path.exists():
            return
        broker = load_public(self.keys_dir / "broker.key").public.decode("ascii")
        admin = load_public(self.keys_dir / "admin.key").public.decode("ascii")
        self.acl_path.write_text(
            "# replog cluster up --secure: who may do what (docs/security.md)\n"
            "accounts:\n"
            "  - accessKey: admin          # the CLI: every operation, every topic and group\n"
            f'    curvePublicKey: "{admin}"\n'
            "    admin: true\n"
            "  - accessKey: broker         # the brokers: replication and config sync\n"
            f'    curvePublicKey: "{broker}"\n'
            "    replica: true\n")

    def _zookeeper_auth(self) -> Path:
        """The brokers' ZooKeeper credentials (digest scheme, mode 0600), made once per
        directory: every znode of the group carries an ACL for them alone, so nobody else who
        reaches this ZooKeeper can change the group's state or delete a member's znode."""
        path = self.directory / "zookeeper-auth"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"replog:{secrets.token_urlsafe(24)}\n")
        return path

    def client_curve(self) -> dict[str, Any]:
        """The CLI's ``key``/``server_key`` for this cluster ({} when it is plain)."""
        if not self.secure:
            return {}
        return {"key": str(self.keys_dir / "admin.key_secret"),
                "server_key": str(self.keys_dir / "broker.key")}

    def _child(self, index: int, mode: str, group: int = 0) -> ChildBroker:
        port = self.base_port + GROUP_PORT_STRIDE * group + 10 * index
        master_role = "SYNC_MASTER" if mode == "sync" else "ASYNC_MASTER"
        name = f"broker-{index}" if self.groups == 1 else f"{group_name(group)}-{index}"
        home = self.directory / name
        fields: dict[str, Any] = {
            "brokerClusterName": CLUSTER_NAME,
            "brokerName": group_name(group),
            "listenPort": port,
            "haListenPort": port + 1,
            "storePathRootDir": str(home / "store"),
            "metricsPort": port + 2,
            "mappedFileSizeCommitLog": CLUSTER_SEGMENT_BYTES,
        }
        if self.controller:
            role = "CONTROLLED"
            fields.update(brokerId=index + 1, brokerRole=master_role, enableControllerMode=True,
                          controllerAddr=self.controller_addr,
                          controllerSessionTimeoutMs=self.session_ms,
                          controllerPollIntervalMs=1000,
                          controllerAuthFile=str(self._zookeeper_auth()))
        else:
            role = master_role if index == 0 else "SLAVE"
            fields.update(
                brokerId=index,
                brokerRole=role,
                haMasterAddress="" if index == 0 else f"127.0.0.1:{self.base_port + 1}",
                # the master, restarted after a slave was promoted, rejoins as a slave; a
                # promoted slave, restarted, checks that no newer master exists before it
                # resumes; a slave left behind by a promotion follows the new master
                groupServers=",".join(f"127.0.0.1:{self.base_port + 10 * i}"
                                      for i in range(self.size) if i != index),
            )
        fields.update(self._security_keys())
        fields.update(self.settings)
        cfg = load_config(None, (), env={}, **fields)
        child = ChildBroker(name, role, f"127.0.0.1:{port}", home / "broker.yaml",
                            home / "broker.log", group=group_name(group))
        child.config_path.parent.mkdir(parents=True, exist_ok=True)
        child.config_path.write_text(dump_yaml(cfg))
        return child

    def _security_keys(self) -> dict[str, Any]:
        if not self.secure:
            return {}
        return {"aclEnable": True, "aclFile": str(self.acl_path),
                "curveSecretKeyFile": str(self.keys_dir / "broker.key_secret"),
                "haMasterPublicKeyFile": str(self.keys_dir / "broker.key")}

    # ---- the directory is this process's while it runs ------------------------------------
    @property
    def pid_file(self) -> Path:
        return self.directory / "cluster.pids.json"

    def _claim_directory(self) -> None:
        """Refuse a directory another live ``cluster up`` runs on; kill what a dead one left
        running (its brokers and ZooKeeper run in sessions of their own and outlive it when it
        is killed with SIGKILL); then record this process and, as they start, its children."""
        try:
            doc = json.loads(self.pid_file.read_text())
        except (FileNotFoundError, ValueError):
            doc = {}
        owner = doc.get("pid")
        if isinstance(owner, int) and owner != os.getpid() and _runs(owner, "cluster"):
            raise UsageError(f"a replog cluster up (pid {owner}) runs on {self.directory}: stop "
                             f"it first (Ctrl-C in its terminal, or kill {owner})")
        leftovers = [pid for pid in doc.get("children", []) if isinstance(pid, int)
                     and _runs(pid, str(self.directory))]
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if leftovers:
            err.print(f"killed {len(leftovers)} processes left by a cluster up that died "
                      f"({', '.join(map(str, leftovers))})")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write_pids()

    def _write_pids(self) -> None:
        children = [c.process.pid for c in self.children if c.process is not None]
        if self.zookeeper is not None:
            children += [n.process.pid for n in self.zookeeper.nodes if n.process is not None]
        self.pid_file.write_text(json.dumps({"pid": os.getpid(), "children": children}))

    def _require_free_ports(self) -> None:
        wanted = [(c.name, int(c.address.rsplit(":", 1)[1]) + off)
                  for c in self.children for off in (0, 1, 2)]
        if self.zookeeper is not None:
            wanted += [("ZooKeeper", n.client_port) for n in self.zookeeper.nodes]
        taken = [f"{name}'s port {port}" for name, port in wanted if not ports.is_free(port)]
        if taken:
            raise UsageError(f"in use: {', '.join(taken)}; another cluster (or program) "
                             "listens there: stop it, or give --base-port")

    def start(self) -> None:
        self._claim_directory()
        self._require_free_ports()
        if self.zookeeper is not None:
            for node in self.zookeeper.nodes:
                node.start(prefix=die_with_parent())
            self._write_pids()
            self.zookeeper.start_waiting()
        for child in self.children:
            self.start_child(child)
        self._write_pids()
        self.wait_ready(READY_TIMEOUT_S)
        if self.zookeeper is not None:
            self.wait_routes(READY_TIMEOUT_S)

    def start_child(self, child: ChildBroker) -> None:
        """Start (or restart) one broker from its YAML."""
        child.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(child.log_path, "ab") as log_file:
            child.process = subprocess.Popen(
                [*die_with_parent(), sys.executable, "-m", "common.cli", "broker", "-c",
                 str(child.config_path)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches cluster up, which stops them in order
                env=broker_env(),
            )

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with Admin([c.address for c in self.children], timeout_ms=1000, retries=0,
                   **self.client_curve()) as admin:
            for child in self.children:
                while True:
                    if child.process is not None and child.process.poll() is not None:
                        raise RuntimeError(
                            f"{child.name} exited with {child.process.returncode}; "
                            f"see {child.log_path}"
                        )
                    try:
                        answered = admin.status(child.address)
                    except BrokerError:
                        answered = None
                    if answered is not None:
                        if child.process is not None and answered.get("pid") != child.process.pid:
                            raise RuntimeError(
                                f"{child.address} is answered by pid {answered.get('pid')}, not "
                                f"by {child.name} (pid {child.process.pid}): another broker "
                                f"listens there; see {child.log_path}")
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{child.name} not answering at {child.address}; "
                                           f"see {child.log_path}")

    def wait_routes(self, timeout_s: float) -> None:
        """Until every group has a master that the routes (CLUSTER_INFO, what clients and a
        cluster-wide topic creation read) name: only then is the cluster ready."""
        wanted = sorted({c.group for c in self.children})
        deadline = time.monotonic() + timeout_s
        missing: list[str] = wanted
        with Admin([c.address for c in self.children], timeout_ms=1000, retries=0,
                   **self.client_curve()) as admin:
            while time.monotonic() < deadline:
                for child in self.children:
                    if child.process is not None and child.process.poll() is not None:
                        raise RuntimeError(f"{child.name} exited with "
                                           f"{child.process.returncode}; see {child.log_path}")
                try:
                    info = admin.cluster_info(self.children[0].address)
                except BrokerError:
                    info = {}
                routed = {g.get("brokerName") for g in info.get("groups", []) if g.get("master")}
                missing = [g for g in wanted if g not in routed]
                if not missing:
                    return
                time.sleep(0.1)
        raise RuntimeError(f"groups {missing} have no master in the routes after "
                           f"{timeout_s:.0f} s; see their logs under {self.directory}")

    def status_line(self, admin: Admin) -> str:
        parts = []
        for child in self.children:
            try:
                s = admin.status(child.address)
                parts.append(
                    f"{child.name} {s['role']} max={s['maxPhyOffset']} "
                    f"put/s={s.get('putTps', 0):.0f}"
                )
            except BrokerError:
                parts.append(f"{child.name} DOWN")
        return " | ".join(parts)

    def stop(self) -> None:
        """SIGTERM every child, wait (bounded; ``force_stop`` cuts it short), SIGKILL what
        is left."""
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in self.children:
            proc = child.process
            if proc is None:
                continue
            while proc.poll() is None and time.monotonic() < deadline and \
                    not self.force_stop():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.1)
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        if self.zookeeper is not None:
            self.zookeeper.stop()
        self.pid_file.unlink(missing_ok=True)

    def group_children(self, group: str) -> list[ChildBroker]:
        return [c for c in self.children if c.group == group]

    def masters(self, admin: Admin) -> dict[str, ChildBroker]:
        """Group -> the child serving as its master now (groups without one left out)."""
        found = {}
        for group in sorted({c.group for c in self.children}):
            master = self.master(admin, group)
            if master is not None:
                found[group] = master
        return found

    def master(self, admin: Admin, group: str | None = None) -> ChildBroker | None:
        """The child serving as master now (the controller's pick, or broker-0's successor),
        of ``group`` (default: the first group)."""
        for child in self.group_children(group or self.children[0].group):
            try:
                s = admin.status(child.address)
            except BrokerError:
                continue
            ctl = s.get("controller") or {}
            if s["role"] in ("SYNC_MASTER", "ASYNC_MASTER") and (
                    not ctl.get("enabled") or (ctl.get("isMaster") and ctl.get("leaseFresh"))):
                return child
        return None


def die_with_parent() -> list[str]:
    """The command prefix that ends a child when ``cluster up`` dies, kill -9 included (a child
    in a session of its own outlived it): util-linux's setpriv sets Linux's PR_SET_PDEATHSIG,
    then runs the child's command. Without setpriv the next ``cluster up`` on the directory
    kills what is left (``_claim_directory``)."""
    return ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []


def _runs(pid: int, marker: str) -> bool:
    """Whether ``pid`` is a live process whose command line holds ``marker``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return marker.encode() in cmdline


def broker_env() -> dict[str, str]:
    """This environment minus ``REPLOG_*`` variables that are not config keys (REPLOG_DEMO_...),
    which a broker would refuse as unknown keys."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("REPLOG_") or k[len("REPLOG_") :] in KNOWN_KEYS
    }


@contextlib.contextmanager
def running_cluster(cluster: LocalCluster) -> Iterator[LocalCluster]:
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def cmd_cluster(args: argparse.Namespace) -> int:
    if args.action != "up":
        raise UsageError("usage: replog cluster up [...]")
    groups = getattr(args, "groups", 1)
    top = GROUP_PORT_STRIDE * (groups - 1) + 10 * args.slaves + 2
    if args.slaves < 0 or not 1 <= args.base_port <= 65535 - top:
        raise UsageError("--slaves must be >= 0 and ports must fit below 65536")
    if groups > 1 and args.slaves > 7:
        raise UsageError("with several groups at most 7 slaves each (a group's ports span "
                         f"{GROUP_PORT_STRIDE})")
    cluster = LocalCluster(Path(args.dir), args.slaves, args.mode, args.base_port,
                           controller=not args.no_controller, zk_port=args.zk_port,
                           session_ms=args.session_ms, groups=groups,
                           secure=args.secure)
    with StopSignals() as stop:
        cluster.force_stop = stop.forced
        with running_cluster(cluster):
            console = _start_console(args, cluster)
            try:
                _announce(args, cluster, console)
                _watch(args, cluster, stop)
            finally:
                if console is not None:
                    console.stop()
    if not args.json:
        out.print("cluster stopped")
    return EXIT_OK


def _start_console(args: argparse.Namespace, cluster: LocalCluster) -> ConsoleChild | None:
    """The web console over the cluster (``--no-console``: none); a console that cannot start
    (its port taken) is reported and the cluster runs on without it."""
    if args.no_console:
        return None
    port = args.console_port or args.base_port + CONSOLE_PORT_OFFSET
    console = ConsoleChild(cluster.directory, [c.address for c in cluster.children], port,
                           cluster.client_curve(), broker_env(), die_with_parent())
    try:
        console.start()
    except RuntimeError as e:
        err.print(f"no console: {e}", soft_wrap=True)
        return None
    return console


def _announce(args: argparse.Namespace, cluster: LocalCluster,
              console: ConsoleChild | None = None) -> None:
    if args.json:
        doc: dict[str, Any] = {"dir": str(cluster.directory),
                               "brokers": [c.to_json() for c in cluster.children]}
        if console is not None:
            doc["console"] = console.to_json()
        if cluster.zookeeper is not None:
            doc["zookeeper"] = [{"address": n.address, "pid": n.pid}
                                for n in cluster.zookeeper.nodes]
        if cluster.secure:
            doc["acl"] = str(cluster.acl_path)
            doc["keys"] = {"key": str(cluster.keys_dir / "admin.key_secret"),
                           "serverKey": str(cluster.keys_dir / "broker.key")}
        emit_json(doc)
        return
    table = Table(title=f"replog cluster under {cluster.directory}")
    for col in ("name", "group", "role", "client address", "HA port", "pid", "log"):
        table.add_column(col)
    for c in cluster.children:
        port = int(c.address.rsplit(":", 1)[1])
        table.add_row(
            c.name,
            c.group,
            c.role,
            c.address,
            str(port + 1),
            str(c.process.pid if c.process else ""),
            str(c.log_path),
        )
    out.print(table)
    if cluster.zookeeper is not None:
        out.print(f"controller: ZooKeeper at {cluster.controller_addr} (session "
                  f"{cluster.session_ms} ms): `replog controller status -s "
                  f"{cluster.children[0].address}`")
    first = cluster.children[0].address
    if cluster.groups > 1:
        out.print(f"{cluster.groups} broker groups share the cluster: `replog status --cluster "
                  f"-s {first}`, `replog topics -s {first} --create T --queues 4`",
                  soft_wrap=True)
    if cluster.secure:
        curve = cluster.client_curve()
        out.print(f"CURVE and ACL on ({cluster.acl_path}); the CLI needs its key:")
        out.print(f"  export REPLOG_KEY={curve['key']} REPLOG_SERVER_KEY={curve['server_key']}",
                  soft_wrap=True)
    if console is not None:
        out.print(f"console: {console.url} (admin password in {console.password_file})",
                  soft_wrap=True)
    out.print(f"ready: every group has a master. try: replog send -s {first} -t orders -b hello; "
              f"replog status -s {first}   (Ctrl-C stops the cluster)", soft_wrap=True)


class StopSignals:
    """SIGINT and SIGTERM, counted, with no lock in the handler: it only adds one, and the
    main loop wakes on ``signal.set_wakeup_fd``'s socket. (A handler that called Event.set
    could run inside the main thread's own Event.set and deadlock on its lock: Ctrl-C twice
    froze cluster up until kill -9.) A second signal forces the stop (SIGKILL)."""

    def __init__(self) -> None:
        self.count = 0
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self._previous: dict[int, Any] = {}
        self._old_fd = -1

    def __enter__(self) -> Self:
        self._old_fd = signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        self._previous = {s: signal.signal(s, self._count) for s in (signal.SIGINT,
                                                                     signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._old_fd)
        self._r.close()
        self._w.close()

    def _count(self, _signum: int, _frame: object) -> None:
        self.count += 1

    def forced(self) -> bool:
        return self.count >= 2

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s`` or until a signal; True once one came."""
        if self.count == 0:
            select.select([self._r], [], [], timeout_s)
            with contextlib.suppress(BlockingIOError):
                while self._r.recv(64):
                    pass
        return self.count > 0


def _watch(args: argparse.Namespace, cluster: LocalCluster, stop: StopSignals) -> None:
    deadline = time.monotonic() + args.duration if args.duration else float("inf")
    with Admin([c.address for c in cluster.children], timeout_ms=1000, retries=0,
               **cluster.client_curve()) as admin:
        while not stop.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                break
            if not args.json:
                err.print(cluster.status_line(admin), end="\r", soft_wrap=True)
    if not args.json:
        err.print()



