"""The compose cluster in a real engine (docs/operations.md "Run a cluster with Docker";
docs/drills.md rows 21-23): the broker image, msgIds of container-stored messages, a ZooKeeper
node lost, and the failover drill through the Docker SDK (``replog drill --backend docker``):
SIGKILLs of the master, partitions from ZooKeeper and from its slaves, a pause, under
SYNC_MASTER; lost = 0, unexpected = 0, replicas identical by the checksums they report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from compose_harness import GROUP_B_PORTS, REPO, ComposeCluster, busy_ports

from common.client import Admin, Producer, Transport
from common.core.errors import ResponseCode, SendStatus
from common.core.message import decode_msg_id
from common.drill.group import master_of
from common.format.protocol import RequestCode

pytestmark = [pytest.mark.docker, pytest.mark.integration]

A = ["127.0.0.1:10911", "127.0.0.1:10921", "127.0.0.1:10931"]
B = ["127.0.0.1:10941", "127.0.0.1:10951", "127.0.0.1:10961"]
KILLS = int(os.environ.get("DRILL_DOCKER_KILLS", "5"))


def statuses(addresses: list[str]) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = []
    with Admin(addresses, timeout_ms=2000, retries=0) as admin:
        for address in addresses:
            try:
                out.append(admin.status(address))
            except Exception:  # noqa: BLE001 - a broker not answering counts as down
                out.append(None)
    return out


def wait_master(addresses: list[str], timeout_s: float = 60) -> tuple[int, dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = statuses(addresses)
        index = master_of(found)
        if index is not None and all(s is not None for s in found):
            master = found[index]
            assert master is not None
            if set(master["controller"]["syncStateSet"]) == {1, 2, 3}:
                return index, master
        assert time.monotonic() < deadline, f"no settled group at {addresses}: {found}"
        time.sleep(0.2)


@pytest.mark.timeout(900)
def test_broker_image_is_non_root_without_a_compiler(compose_cluster: ComposeCluster) -> None:
    client = compose_cluster.client()
    image = client.images.get("replog:latest")
    config = image.attrs["Config"]
    assert config["User"] == "replog" and config["Healthcheck"]["Test"][0] == "CMD"
    running = compose_cluster.container("broker-a-1")
    probe = "id -u; id -g; for c in gcc cc g++ c++ clang make; do command -v $c; done; true"
    code, out = running.exec_run(["sh", "-c", probe])  # as the image's user
    assert code == 0 and out.decode().split() == ["10001", "10001"], \
        f"uid, gid, then any compiler found: {out!r}"
    top = running.top(ps_args="-o pid,uid,comm")["Processes"]
    assert top and all(p[1] == "10001" for p in top), top
    size_mb = round(image.attrs["Size"] / 1e6, 1)
    compose_cluster.record(image_size_mb=size_mb)
    print(f"\n[compose] replog:latest {size_mb} MB, user {config['User']}, no compiler")


@pytest.mark.timeout(300)
def test_a_msg_id_finds_its_message_and_only_on_its_broker(
        compose_cluster: ComposeCluster) -> None:
    """Records carry the container's IPv4 address (brokerIP1 is a name) and its port; a msgId
    finds the message on every replica of its group, and group b answers "not here" for a
    record of group a at an offset where b has a record of its own, and the other way round."""
    with Producer(A, timeout_ms=10_000) as p:
        sent = p.send("ids", b"stored in a container", keys="k-a")
    assert sent.status == SendStatus.SEND_OK
    _, master = wait_master(A)
    name = master["address"].split(".")[0]  # broker-a-N.data:port
    container = compose_cluster.container(name)
    data_ip = next(v["IPAddress"] for k, v in
                   container.attrs["NetworkSettings"]["Networks"].items() if k.endswith("_data"))
    ip, port, _ = decode_msg_id(sent.msg_id)
    assert (ip, port) == (data_ip, int(master["address"].rpartition(":")[2])), sent.msg_id
    assert ip != "0.0.0.0"
    with Admin(A, timeout_ms=10_000) as admin:
        for address in A:  # the master and both slaves: the same bytes
            deadline = time.monotonic() + 30
            while (found := admin.query_by_msg_id(sent.msg_id, address=address)) is None:
                assert time.monotonic() < deadline, f"{sent.msg_id} not on {address}"
                time.sleep(0.2)
            assert found.body == b"stored in a container" and found.msg_id == sent.msg_id
        first_a = admin.query_by_offset(0)
        assert first_a is not None
    busy = busy_ports(GROUP_B_PORTS)
    assert not busy, f"ports {busy} are taken"
    compose_cluster.compose("up", "-d", "--wait", "--wait-timeout", "180", "broker-b-1",
                            "broker-b-2", "broker-b-3", timeout_s=240)
    try:
        wait_master(B)
        with Producer(B, timeout_ms=10_000) as p:  # a cluster of two groups now: pinned to b
            first_b = p.send("ids", b"group b", broker_name="broker-b")
        assert first_b.status == SendStatus.SEND_OK and first_b.commit_log_offset == 0
        assert first_a.commit_log_offset == 0 and first_a.msg_id != first_b.msg_id
        transport = Transport(name="compose-msgid")
        try:
            for msg_id, others in ((first_a.msg_id, B), (first_b.msg_id, A)):
                ip, port, _ = decode_msg_id(msg_id)
                for address in others:  # a record starts at that offset there: not this one
                    resp = transport.call_sync(address, RequestCode.QUERY_BY_MSG_ID,
                                               {"msgId": msg_id}, (), 10_000)
                    assert resp.code == ResponseCode.QUERY_NOT_FOUND, (address, resp)
                    assert f"{ip}:{port}" in resp.remark
        finally:
            transport.close()
        with Admin(B + A, timeout_ms=10_000) as admin:  # asked in turn: found on group a
            found = admin.query_by_msg_id(first_a.msg_id)
            assert found is not None and found.msg_id == first_a.msg_id
    finally:
        compose_cluster.compose("rm", "--stop", "--force", "-v", "broker-b-1", "broker-b-2",
                                "broker-b-3", timeout_s=120)


@pytest.mark.timeout(300)
def test_the_group_keeps_working_with_one_zookeeper_node_killed(
        compose_cluster: ComposeCluster) -> None:
    """SIGKILL the ensemble's leader: the other two elect a leader among themselves and keep
    the quorum. Every broker keeps its session, the master its epoch, and every send (through
    the client, which retries the blip while the sessions move to another node) is SEND_OK.
    Then a failover still works on two nodes."""
    index, master = wait_master(A)
    epoch = master["epoch"]
    losses = [s["controller"]["stats"]["session_losses"] for s in statuses(A) if s]
    leader = None
    for zk in ("zk1", "zk2", "zk3"):
        code, out = compose_cluster.container(zk).exec_run(
            ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/2181; printf srvr >&3; cat <&3"])
        if code == 0 and b"Mode: leader" in out:
            leader = zk
    assert leader is not None, "no ZooKeeper node says it leads"
    victim = compose_cluster.container(leader)
    results: list[tuple[float, str]] = []
    stop = threading.Event()

    def send() -> None:
        with Producer(A, timeout_ms=10_000) as p:
            i = 0
            while not stop.is_set():
                try:
                    outcome = p.send("zk-loss", f"m{i}".encode()).status.value
                except Exception as e:  # noqa: BLE001 - every outcome is checked below
                    outcome = repr(e)
                results.append((time.monotonic(), outcome))
                i += 1
                stop.wait(0.05)

    sender = threading.Thread(target=send, name="zk-loss-sender", daemon=True)
    sender.start()
    try:
        time.sleep(2)
        killed_at = time.monotonic()
        victim.kill(signal="SIGKILL")
        time.sleep(12)  # three session timeouts: a session not moved in time would be lost
        stop.set()
        sender.join(30)
        assert not sender.is_alive()
        after = [r for r in results if r[0] >= killed_at]
        assert len(after) > 50 and all(o == "SEND_OK" for _, o in after), \
            [o for _, o in after if o != "SEND_OK"][:5]
        times = [t for t, _ in after]
        pause_s = max(b - a for a, b in zip([killed_at, *times], times, strict=False))
        compose_cluster.record(zookeeper_leader_loss_write_pause_s=round(pause_s, 3))
        print(f"\n[compose] {leader} (leader) killed: {len(after)} sends all SEND_OK, longest "
              f"pause {pause_s:.2f} s")
        index2, master2 = wait_master(A)
        assert (index2, master2["epoch"]) == (index, epoch), "an election happened"
        after_losses = [s["controller"]["stats"]["session_losses"] for s in statuses(A) if s]
        assert len(losses) == 3 and after_losses == losses, "a broker lost its session"
        # a failover on the two nodes left
        old = compose_cluster.container(master2["address"].split(".")[0])
        old.kill(signal="SIGKILL")
        try:
            others = [a for i, a in enumerate(A) if i != index]
            deadline = time.monotonic() + 60
            while (found := master_of(statuses(others))) is None:
                assert time.monotonic() < deadline, "no failover on two ZooKeeper nodes"
                time.sleep(0.2)
            new = statuses([others[found]])[0]
            assert new is not None and new["epoch"] > epoch
        finally:
            old.start()
    finally:
        stop.set()
        victim.start()
    wait_master(A)
    deadline = time.monotonic() + 120  # the node rejoins the ensemble
    while (compose_cluster.container(leader).attrs["State"].get("Health") or {}).get(
            "Status") != "healthy":
        assert time.monotonic() < deadline, f"{leader} did not rejoin"
        time.sleep(1)


@pytest.mark.timeout(900)
def test_docker_drill_sigkills_partitions_and_pauses_the_master(
        compose_cluster: ComposeCluster) -> None:
    """The acceptance drill: >= 5 SIGKILLs of the master, a partition of the master from
    ZooKeeper, one from its slaves, a pause; SYNC_MASTER, automatic failover every time."""
    faults = f"kill={KILLS},partition-zk=1,partition-slaves=1,pause=1"
    report_path = REPO / "build" / "compose-drill.json"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "common.cli", "drill", "--backend", "docker", "--project",
         compose_cluster.project, "--faults", faults, "--json",
         "--history", str(REPO / "build" / "compose-drill-history.jsonl")],
        cwd=REPO, capture_output=True, text=True, timeout=840, check=False)
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout)
    report_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    keys = ("attempted", "ok", "info", "fail", "lost", "unexpected", "duplicated",
            "failover_p50_s", "failover_max_s", "logs_identical", "verdict", "seed")
    print(f"\n[compose] drill: {json.dumps({k: report.get(k) for k in keys})}")
    compose_cluster.record(drill_s=round(time.monotonic() - started, 1),
                           failover_p50_s=report["failover_p50_s"],
                           failover_max_s=report["failover_max_s"])
    assert done.returncode == 0, (report["problems"], done.stderr[-2000:])
    assert report["verdict"] == "pass" and report["mode"] == "SYNC_MASTER"
    assert report["lost"] == 0 and report["unexpected"] == 0
    kinds = [f["status"] for f in report["faults"]]
    assert sorted(kinds) == sorted(["kill"] * KILLS + ["partition-zk", "partition-slaves",
                                                        "pause"])
    for f in report["faults"]:
        if f["status"] != "partition-slaves":  # ZooKeeper still backs a master cut from slaves
            assert f["epoch_after"] > f["epoch_before"] and f["elected"] != f["node"], f
        assert f["rto_s"] is not None, f
    checks = report["checksums"]
    assert checks["identical"] and len(checks["by_node"]) == 3
    assert checks["range"][1] > checks["range"][0]
    tx = report["transactions"]  # a transaction producer beside the plain ones
    assert tx["tx_committed"] > 0 and tx["tx_rolled_back"] > 0, tx
    assert tx["tx_rolled_back_consumed"] == tx["tx_committed_lost"] == 0, tx
    assert tx["tx_consumed_before_commit"] == tx["tx_both"] == 0, tx


@pytest.mark.timeout(300)
def test_an_image_build_before_the_wheels_says_what_to_run(tmp_path: Any) -> None:
    """``docker compose up --build`` before ``compose/build-wheels.sh`` failed with "failed to
    walk .../build": the build stops at once and names the script."""
    from compose_harness import docker_problem, missing_or_fail

    problem = docker_problem()
    if problem:
        missing_or_fail(problem)
    import shutil

    context = tmp_path / "context"  # the repository's context, without build/wheels/
    shutil.copytree(REPO / "compose", context / "compose")
    shutil.copy(REPO / ".dockerignore", context / ".dockerignore")
    done = subprocess.run(["docker", "build", "-f", "compose/Dockerfile", "-t",
                           "replog-no-wheels-check", "."], cwd=context, capture_output=True,
                          text=True, timeout=240, check=False)
    subprocess.run(["docker", "rmi", "-f", "replog-no-wheels-check"], capture_output=True,
                   check=False)
    assert done.returncode != 0
    assert "run compose/build-wheels.sh first" in done.stdout + done.stderr, done.stdout[-2000:]


@pytest.mark.timeout(300)
def test_the_console_service_shows_the_group(compose_cluster: ComposeCluster) -> None:
    """The compose cluster's console (service ``console``, http://127.0.0.1:8080/): its page
    is served, and its cluster view names broker-a's master and all three members, each
    answering (it reads them over the containers' network)."""
    import json
    import urllib.request

    with urllib.request.urlopen("http://127.0.0.1:8080/", timeout=10) as resp:
        assert b"replog console" in resp.read()
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen("http://127.0.0.1:8080/api/cluster", timeout=10) as resp:
            doc = json.loads(resp.read())
        groups = {g["brokerName"]: g for g in doc["groups"]}
        group = groups.get("broker-a")
        if group and group["master"] and len(group["members"]) == 3 and all(
                m["reachable"] for m in group["members"]):
            break
        assert time.monotonic() < deadline, doc
        time.sleep(1)
    assert group["master"].startswith("broker-a-") and group["syncStateSet"]
