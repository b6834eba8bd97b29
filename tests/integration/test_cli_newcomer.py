"""The command line as a newcomer meets it (docs/operations.md, "replog cluster up"): a
cluster that says ready is ready, that refuses a directory another one runs on, whose brokers
end with it even when it is killed, that stops at a second Ctrl-C, whose table is whole when
piped; client commands that say at once that nothing listens, that a topic or queue does not
exist, and that show their defaults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

import pytest
from broker_harness import REPO, BrokerProcess, _child_env, brokers, free_port
from replication_harness import wait_for

from common.core import ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def replog(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "common.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s, env=_child_env(),
                          check=False)


def _base() -> int:
    for _ in range(50):
        base = free_port(3)
        if all(ports.is_free(base + off) for off in (10, 11, 12, 20, 21, 22, 88)):
            return base
    raise RuntimeError("no free port range")


class ClusterUp:
    """``replog cluster up --no-controller`` as a child; every pid it reports is killed on the
    way out, whatever happened."""

    def __init__(self, directory: Path, *extra: str, json_out: bool = True):
        self.base = _base()
        self.args = [sys.executable, "-m", "common.cli", "cluster", "up", "--dir",
                     str(directory), "--no-controller", "--slaves", "1", "--base-port",
                     str(self.base), *(["--json"] if json_out else []), *extra]
        self.proc: subprocess.Popen[str] | None = None
        self.doc: dict[str, Any] = {}

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen(self.args, cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=_child_env(),
                                     start_new_session=True)
        return self

    def ready(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        self.doc = json.loads(self.proc.stdout.readline())
        return self.doc

    @property
    def pids(self) -> list[int]:
        console = self.doc.get("console") or {}
        return [b["pid"] for b in self.doc.get("brokers", [])] + \
            ([console["pid"]] if console.get("pid") else [])

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of an exited parent is reaped by init soon: it counts as gone
    state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] if \
        Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"


def test_a_killed_cluster_up_takes_its_brokers_with_it(tmp_path: Path) -> None:
    with ClusterUp(tmp_path / "c") as up:
        up.ready()
        pids = up.pids  # the brokers and the console
        assert up.doc["console"]["url"] == f"http://127.0.0.1:{up.base + 88}/"
        assert all(_alive(p) for p in pids) and len(pids) == 3
        assert up.proc is not None
        up.proc.kill()  # SIGKILL: no chance to stop them itself
        up.proc.wait(10)
        wait_for(lambda: not any(_alive(p) for p in pids), 30, "the brokers to end")


def test_a_second_cluster_up_on_a_running_directory_refuses_loudly(tmp_path: Path) -> None:
    with ClusterUp(tmp_path / "c") as first:
        first.ready()
        second = replog("cluster", "up", "--dir", str(tmp_path / "c"), "--no-controller",
                        "--base-port", str(first.base), "--duration", "1")
        assert second.returncode == 2, second
        assert "runs on" in second.stderr and str(first.proc.pid) in second.stderr  # type: ignore[union-attr]


def test_two_ctrl_c_stop_cluster_up_at_once(tmp_path: Path) -> None:
    with ClusterUp(tmp_path / "c") as up:
        up.ready()
        assert up.proc is not None
        started = time.monotonic()
        up.proc.send_signal(signal.SIGINT)
        up.proc.send_signal(signal.SIGINT)
        up.proc.wait(15)  # a deadlock in its handler froze it until kill -9
        assert time.monotonic() - started < 15
        wait_for(lambda: not any(_alive(p) for p in up.pids), 30, "the brokers to end")


def test_the_table_is_whole_when_piped(tmp_path: Path) -> None:
    with ClusterUp(tmp_path / "a-directory-with-a-rather-long-name-for-the-test", "--duration",
                   "2", json_out=False) as up:
        assert up.proc is not None
        out, _ = up.proc.communicate(timeout=90)
    logs = [line for line in out.splitlines() if "broker.log" in line]
    assert logs and all("a-directory-with-a-rather-long-name-for-the-test" in line
                        for line in logs), out
    assert "replog send -s 127.0.0.1:" in out  # hints are whole commands


def test_a_client_says_at_once_that_nothing_listens() -> None:
    port = free_port()
    started = time.monotonic()
    done = replog("status", "-s", f"127.0.0.1:{port}")
    assert time.monotonic() - started < 5  # it waited the 10 s timeout before
    assert done.returncode == 1
    assert "nothing listens" in done.stderr and "replog cluster up" in done.stderr


def test_pull_of_a_topic_or_queue_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b", defaultTopicQueueNums=2)
    with brokers(broker):
        assert replog("send", "-s", broker.address, "-t", "there", "-b", "x").returncode == 0
        none = replog("pull", "-s", broker.address, "-t", "nowhere")
        assert none.returncode == 1 and "there is no topic nowhere" in none.stderr
        queue = replog("pull", "-s", broker.address, "-t", "there", "-q", "7")
        assert queue.returncode == 1 and "there is no queue 7" in queue.stderr
        assert replog("pull", "-s", broker.address, "-t", "there", "-q", "1").returncode == 0


def test_help_shows_the_defaults() -> None:
    done = replog("send", "--help")
    assert "127.0.0.1:10911" in done.stdout and "--delay-level" in done.stdout
    assert "(default: 10000)" in done.stdout
