"""Failover drills, PR tier (docs/drills.md rows 1, 2, 4 and 13).

Each drill starts its own brokers on free ports, records a history (``harness.History``), and
ends with a heal, a drain of every queue from every replica, a byte comparison of the
replicas' CommitLogs and the total-queue check. ``DRILL_SEED=n`` replays a run's random choices.
"""

from __future__ import annotations

import os
import random
import threading
from collections import Counter as Counter_
from pathlib import Path
from typing import Any

import pytest
from harness import (
    QUEUES,
    SEGMENT_BYTES,
    TOPIC,
    Drill,
    Node,
    ProducerWorker,
    burst,
    make_body,
    wait_more_puts,
)
from replication_harness import commitlog_digest, wait_for

from common.client import SEND_CODES, Transport
from common.core.errors import BrokerError, ResponseCode
from common.format.protocol import RequestCode
from common.ha import epochs

pytestmark = [pytest.mark.drill, pytest.mark.integration]

CYCLES = int(os.environ.get("DRILL_CYCLES", "5"))
PRODUCERS = 4
RATE = 60.0  # puts/s per producer (2-core CI box running two brokers and the clients)


def _load(drill: Drill, nodes: list[Node], producers: int = PRODUCERS, rate: float = RATE) -> None:
    drill.add_load([n.address for n in nodes], producers, rate)


def _wait_puts(drill: Drill, n: int, timeout_s: float = 20.0) -> None:
    wait_more_puts(drill.history, n, timeout_s)


def _random_wait(drill: Drill, low: float, high: float) -> None:
    """The nemesis waits a random time (the fault lands at a random point of the workload)."""
    threading.Event().wait(drill.rng.uniform(low, high))


# ---- 1 -----------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_sync_no_acked_loss_across_failovers(tmp_path: Path) -> None:
    """Row 1: SIGKILL the SYNC master at a random time, promote the slave (``replog promote``),
    restart the old master as a SLAVE of the new one; producers and a consumer run throughout
    through the client. lost = 0, unexpected = 0."""
    with Drill("sync-failover", tmp_path) as drill:
        a = drill.node("a", slave_id=1)
        b = drill.node("b", slave_id=2)
        drill.start_group(a, "SYNC_MASTER", b)
        _load(drill, [a, b])
        master, slave = a, b
        for cycle in range(CYCLES):
            _wait_puts(drill, 20)
            _random_wait(drill, 1.0, 4.0)
            master.kill()
            doc = drill.promote(slave, cli=cycle % 2 == 0)
            assert doc["role"] == "SYNC_MASTER", doc
            master.start("SLAVE", master=slave)
            drill.wait_slave_in_sync(slave)
            master, slave = slave, master
        _wait_puts(drill, 20)
        summary = drill.finish(master, [slave])
        assert summary["verdict"] == "pass", summary["problems"]


# ---- 2 -----------------------------------------------------------------------------------------
def _ok_events(drill: Drill) -> list[dict[str, Any]]:
    return [e for e in drill.history.events if e["op"] == "put" and e["type"] == "ok"]


def _completions(drill: Drill, proc: str, after: float) -> list[dict[str, Any]]:
    return [
        e
        for e in drill.history.events
        if e["op"] == "put" and e["proc"] == proc and e["type"] != "invoke" and e["t"] > after
    ]


@pytest.mark.timeout(180)
def test_sync_paused_master_is_fenced(tmp_path: Path) -> None:
    """Row 2: SIGSTOP the SYNC master longer than failover detection, promote the slave, write
    to the new master, SIGCONT the old one. A writer pinned to the old master keeps putting:
    nothing it gets after SIGCONT is SEND_OK; no two masters SEND_OK in one epoch; lost = 0."""
    with Drill("sync-zombie", tmp_path) as drill:
        a = drill.node("a", slave_id=1)
        b = drill.node("b", slave_id=2)
        drill.start_group(a, "SYNC_MASTER", b)
        _load(drill, [a, b], producers=3)
        drill.add_worker(ProducerWorker(drill.history, [a.address], "zombie-writer", 30.0))
        _wait_puts(drill, 30)
        _random_wait(drill, 0.5, 2.0)
        a.pause()
        doc = drill.promote(b)
        new_epoch, epoch_start = doc["epoch"], doc["epochStartOffset"]
        t_promoted = drill.history.now()
        # the new master takes writes (SLAVE_NOT_AVAILABLE until a slave joins: stored, info)
        wait_for(
            lambda: (
                sum(
                    1
                    for e in drill.history.events
                    if e["op"] == "put" and e.get("handler") == b.address and e["t"] > t_promoted
                )
                >= 20
            ),
            20,
            "puts stored by the new master",
            step_s=0.05,
        )
        # paused for longer than the slave-silence detection (haHousekeepingInterval)
        wait_for(
            lambda: drill.history.now() - drill.faults[-2]["t"] > 2.5,
            10,
            "the pause to outlast failover detection",
            step_s=0.05,
        )
        a.resume()
        t_cont = drill.history.now()
        wait_for(
            lambda: len(_completions(drill, "zombie-writer", t_cont)) >= 10,
            30,
            "puts answered after SIGCONT",
            step_s=0.05,
        )
        zombie_after = [
            e
            for e in drill.history.events
            if e["op"] == "put"
            and e["type"] != "invoke"
            and e["t"] > t_cont
            and e.get("handler") == a.address
        ]
        a.kill()
        a.start("SLAVE", master=b)
        drill.wait_slave_in_sync(b)
        _wait_puts(drill, 20)

        def checks(summary: dict[str, Any]) -> list[str]:
            problems = []
            acked_zombie = [e for e in zombie_after if e["type"] == "ok"]
            fenced = [e for e in acked_zombie if e["phy"] >= epoch_start]
            summary["zombie_after_sigcont"] = dict(
                sorted(Counter_(e["status"] for e in zombie_after).items())
            )
            summary["zombie_late_ok_replies"] = len(acked_zombie) - len(fenced)
            if fenced:
                problems.append(
                    f"old master SEND_OK after SIGCONT past the new epoch: {fenced[:3]}"
                )
            # which broker acked each surviving SEND_OK, by the epoch that wrote its offset
            history = epochs.load(b.store_root)
            per_epoch: dict[int, set[str]] = {}
            final = {m for rows in summary["final_ids"].values() for _, m, _ in rows}
            for e in _ok_events(drill):
                if e["msg_id"] in final:
                    epoch = history[epochs.entry_index_at(history, e["phy"])].epoch
                    per_epoch.setdefault(epoch, set()).add(e["handler"])
            summary["ok_handlers_per_epoch"] = {k: sorted(v) for k, v in per_epoch.items()}
            two = {k: v for k, v in per_epoch.items() if len(v) > 1}
            if two:
                problems.append(f"SEND_OK from two masters in one epoch: {two}")
            if new_epoch not in per_epoch:
                problems.append(f"no SEND_OK in the new epoch {new_epoch}")
            return problems

        summary = drill.finish(b, [a], extra_checks=checks)
        assert summary["verdict"] == "pass", summary["problems"]


# ---- 3 -----------------------------------------------------------------------------------------
def _segments(store_root: Path) -> list[Path]:
    return sorted((store_root / "commitlog").iterdir())


def _ids_on_disk(store_root: Path, ids: set[str]) -> set[str]:
    """Which of ``ids`` appear as a drill body anywhere in the CommitLog files."""
    found: set[str] = set()
    needles = {m: f"{m}|".encode() for m in ids}
    for seg in _segments(store_root):
        data = seg.read_bytes()
        found |= {m for m, needle in needles.items() if m not in found and needle in data}
    return found


@pytest.mark.timeout(180)
def test_async_old_master_rejoins_with_divergent_tail(tmp_path: Path) -> None:
    """Row 4: the ASYNC master holds a tail its slave never got (link blackholed); it is
    SIGKILLed, the slave promoted, >= 1 MB written to the new master, and the old master
    restarted as a SLAVE. It truncates exactly at the new epoch's start; after a second SIGKILL
    (taken before it caught up) the divergent bytes are gone from its files and recovery does not
    bring them back; logs are byte-identical after the heal; divergent messages are never served."""
    with Drill("async-divergent-tail", tmp_path) as drill:
        a = drill.node("a", slave_id=1)
        b = drill.node("b", slave_id=2)
        a.start("ASYNC_MASTER")
        link = drill.relay(a.port + 1)
        b.start("SLAVE", ha_address=f"127.0.0.1:{link.port}")
        drill.wait_slave_in_sync(a)
        _load(drill, [a, b], producers=2, rate=150.0)
        _wait_puts(drill, 100)
        link.blackhole()  # the slave hears nothing more: A's tail from here is A's alone
        tail = burst(drill.history, [a.address], "tail", 800, 700, drill.rng)
        a_max = a.status()["maxPhyOffset"]
        a.kill()
        link_dropped = link.dropped_bytes
        doc = drill.promote(b, role="ASYNC_MASTER")
        epoch_start, new_epoch = doc["epochStartOffset"], doc["epoch"]
        assert a_max - epoch_start >= 256 * 1024, (a_max, epoch_start, link_dropped)
        divergent = {e["msg_id"] for e in tail if e.get("handler") == a.address}
        divergent |= {
            e["msg_id"]
            for e in drill.history.events
            if e["op"] == "put"
            and e.get("handler") == a.address
            and e.get("phy", -1) >= epoch_start
        }
        assert divergent and _ids_on_disk(a.store_root, divergent) == divergent
        # >= 1 MB to the new master (past A's old max, so A's truncated files get rewritten)
        burst(drill.history, [b.address, a.address], "new-master", 1700, 700, drill.rng)
        assert b.status()["maxPhyOffset"] - epoch_start >= 1024 * 1024
        # A rejoins as a slave through a relay that lets ~64 KB through, then partitions
        rejoin = drill.relay(b.port + 1)
        rejoin.budget = 64 * 1024
        a.start("SLAVE", ha_address=f"127.0.0.1:{rejoin.port}")
        wait_for(lambda: "event=ha_truncate" in a.log_text(), 20, "the old master to truncate")
        truncated_at = int(
            a.log_text().split("event=ha_truncate", 1)[1].split("phyOffset=")[1].split()[0]
        )
        wait_for(lambda: rejoin.forwarded_down >= rejoin.budget, 20, "the rejoin budget to pass")
        wait_for(
            lambda: a.status()["maxPhyOffset"] > epoch_start, 20, "A to append after truncation"
        )
        a_partial = a.status()["maxPhyOffset"]
        a.kill()  # second kill, before A caught up
        left_on_disk = _ids_on_disk(a.store_root, divergent)
        # restarted while still partitioned: recovery must not bring the tail back
        a.start("SLAVE", ha_address=f"127.0.0.1:{rejoin.port}")
        a_recovered = a.status()["maxPhyOffset"]
        served = set()
        from harness import drain

        for rows in drain(a.address, [a.address, b.address]).values():
            served |= {m for _, m, _ in rows}
        served_divergent_partitioned = served & divergent
        rejoin.budget = None
        rejoin.heal()
        drill.wait_slave_in_sync(b)

        def checks(summary: dict[str, Any]) -> list[str]:
            problems = []
            final = {m for rows in summary["final_ids"].values() for _, m, _ in rows}
            summary.update(
                old_master_max=a_max,
                epoch_start=epoch_start,
                new_epoch=new_epoch,
                truncated_at=truncated_at,
                divergent_messages=len(divergent),
                divergent_bytes=a_max - epoch_start,
                partial_max=a_partial,
                recovered_max_after_second_kill=a_recovered,
                divergent_left_on_disk=len(left_on_disk),
            )
            if truncated_at != epoch_start:
                problems.append(f"truncated at {truncated_at}, epoch starts at {epoch_start}")
            if left_on_disk:
                problems.append(
                    f"{len(left_on_disk)} divergent records still on disk after "
                    f"truncation and SIGKILL: {sorted(left_on_disk)[:5]}"
                )
            if not epoch_start <= a_recovered <= a_partial:
                problems.append(
                    f"recovery after the second kill ended at {a_recovered}, "
                    f"outside [{epoch_start}, {a_partial}]"
                )
            if served_divergent_partitioned:
                problems.append(
                    f"divergent messages served after the second kill: "
                    f"{sorted(served_divergent_partitioned)[:5]}"
                )
            if final & divergent:
                problems.append(
                    f"divergent messages served after rejoin: {sorted(final & divergent)[:5]}"
                )
            return problems

        summary = drill.finish(b, [a], extra_checks=checks, loss_allowed=divergent.__contains__)
        assert summary["verdict"] == "pass", summary["problems"]


# ---- 4 -----------------------------------------------------------------------------------------
def _raw_write(transport: Transport, address: str, i: int) -> Any:
    """One write request straight to ``address`` (no master discovery): SEND mostly, some
    SEND_BATCH and CREATE_TOPIC."""
    kind = i % 20
    if kind == 0:
        return transport.call(address, RequestCode.CREATE_TOPIC, {"topic": f"t{i}", "queueNums": 4})
    body = make_body(f"slave-put-{i}", 64, random.Random(i))
    if kind < 4:
        return transport.call(
            address, RequestCode.SEND_BATCH, {"topic": TOPIC, "queueId": i % QUEUES}, [body, body]
        )
    return transport.call(
        address, RequestCode.SEND, {"topic": TOPIC, "queueId": i % QUEUES}, [body]
    )


def _refused_properly(resp: Any, master_ha: str) -> bool:
    return (
        resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
        and "SLAVE" in resp.remark
        and master_ha in resp.remark
    )


@pytest.mark.timeout(180)
def test_writes_to_a_slave_are_refused_also_during_promotion(tmp_path: Path) -> None:
    """Row 13: 1 000 writes (SEND, SEND_BATCH, CREATE_TOPIC) to a replicating slave are all
    refused with SERVICE_NOT_AVAILABLE naming the master; its log does not change. Then the
    master is killed and one slave promoted while both slaves are hammered with writes: the
    other slave refuses everything; the promoted one refuses until its role changes and accepts
    after, never in between, and nothing it accepts lands below its new epoch's start."""
    with Drill("slave-refuses-writes", tmp_path) as drill:
        m = drill.node("m", slave_id=9)
        s1 = drill.node("s1", slave_id=1)
        s2 = drill.node("s2", slave_id=2)
        drill.start_group(m, "SYNC_MASTER", s1, s2)
        burst(drill.history, [m.address], "before", 300, 256, drill.rng)
        top = drill.wait_converged(m, [s1, s2])
        problems: list[str] = []
        summary: dict[str, Any] = {}
        transport = Transport(name="drill-raw")
        try:
            # phase 1: a quiet group, 1 000 writes to a replicating slave
            pid1 = s1.pid
            before = commitlog_digest(s1.store_root, 0, top, SEGMENT_BYTES)
            answers = [
                f.result(30) for f in [_raw_write(transport, s1.address, i) for i in range(1000)]
            ]
            bad = [a for a in answers if not _refused_properly(a, m.ha_address)]
            st = s1.status()
            summary["phase1"] = {
                "writes": len(answers),
                "refused": len(answers) - len(bad),
            }
            if bad:
                problems.append(
                    f"phase 1: {len(bad)} writes not refused properly: "
                    f"{[(a.code.name, a.remark) for a in bad[:3]]}"
                )
            if (
                st["maxPhyOffset"] != top
                or commitlog_digest(s1.store_root, 0, top, SEGMENT_BYTES) != before
            ):
                problems.append(f"phase 1: slave log changed (max {st['maxPhyOffset']} != {top})")
            if s1.pid != pid1 or s1.proc.proc.poll() is not None:  # type: ignore[union-attr]
                problems.append("phase 1: the slave died")

            # phase 2: master gone, s1 promoted while both slaves take writes
            m.kill()
            s2_before = commitlog_digest(s2.store_root, 0, top, SEGMENT_BYTES)
            log: list[tuple[float, float, str, Any]] = []
            stop = threading.Event()

            def hammer() -> None:
                i = 0
                while not stop.is_set():
                    for node in (s1, s2):
                        t0 = drill.history.now()
                        fut = _raw_write(transport, node.address, 100_000 + i)
                        try:
                            resp: Any = fut.result(30)
                        except BrokerError as e:
                            resp = e
                        log.append((t0, drill.history.now(), node.name, resp))
                        i += 1

            thread = threading.Thread(target=hammer, daemon=True)
            thread.start()
            try:
                wait_for(lambda: len(log) >= 300, 30, "writes before the promotion", step_s=0.02)
                t_promote = drill.history.now()
                doc = drill.promote(s1)
                t_promoted = drill.history.now()
                epoch_start = doc["epochStartOffset"]
                wait_for(
                    lambda: len(log) >= 1000 and sum(1 for e in log if e[0] > t_promoted) >= 200,
                    60,
                    "writes after it",
                    step_s=0.02,
                )
            finally:
                stop.set()
                thread.join(40)
            on_s2 = [e for e in log if e[2] == "s2"]
            bad2 = [
                e
                for e in on_s2
                if isinstance(e[3], BrokerError) or not _refused_properly(e[3], m.ha_address)
            ]
            on_s1 = [e for e in log if e[2] == "s1"]
            accepted = [
                e for e in on_s1 if not isinstance(e[3], BrokerError) and e[3].code in SEND_CODES
            ]
            refused = [e for e in on_s1 if e not in accepted]
            summary["phase2"] = {
                "writes_s2": len(on_s2),
                "refused_s2": len(on_s2) - len(bad2),
                "writes_s1": len(on_s1),
                "s1_refused": len(refused),
                "s1_accepted": len(accepted),
                "promote_s": round(t_promoted - t_promote, 3),
                "epoch_start": epoch_start,
            }
            if bad2:
                problems.append(
                    f"phase 2: the other slave did not refuse {len(bad2)} writes: "
                    f"{[repr(e[3])[:120] for e in bad2[:3]]}"
                )
            if (
                s2.status()["maxPhyOffset"] != top
                or commitlog_digest(s2.store_root, 0, top, SEGMENT_BYTES) != s2_before
            ):
                problems.append("phase 2: the other slave's log changed")
            wrong_refusals = [
                e
                for e in refused
                if isinstance(e[3], BrokerError) or not _refused_properly(e[3], m.ha_address)
            ]
            if wrong_refusals:
                problems.append(
                    f"phase 2: bad refusals by the promoted slave: "
                    f"{[repr(e[3])[:120] for e in wrong_refusals[:3]]}"
                )
            early = [e for e in accepted if e[1] < t_promote]
            late = [e for e in refused if e[0] > t_promoted]
            if early or late:
                problems.append(
                    f"phase 2: accepted before promote {len(early)}, refused after "
                    f"it returned {len(late)}"
                )
            if (
                accepted
                and refused
                and min(e[1] for e in accepted) < max(e[1] for e in refused)
                and max(e[0] for e in refused) > min(e[0] for e in accepted)
            ):
                problems.append("phase 2: the promoted slave refused after it had accepted")
            sends = [e for e in accepted if "commitLogOffset" in e[3].fields]
            if accepted and not sends:  # CREATE_TOPIC answers carry no offset; sends do
                problems.append("phase 2: no accepted send carried its offset")
            below = [
                e
                for e in sends
                if min(e[3].fields.get("offsets") or [e[3].fields["commitLogOffset"]])
                < epoch_start
            ]
            if below:
                problems.append(f"phase 2: {len(below)} accepted writes below the epoch start")
            if commitlog_digest(s1.store_root, 0, epoch_start, SEGMENT_BYTES) != commitlog_digest(
                s2.store_root, 0, epoch_start, SEGMENT_BYTES
            ):
                problems.append("phase 2: the promoted slave's log before its epoch changed")
            for node in (s1, s2):
                if node.proc.proc.poll() is not None:  # type: ignore[union-attr]
                    problems.append(f"{node.name} died")
        finally:
            transport.close()
        result = drill.record(summary, problems)
        assert result["verdict"] == "pass", problems


# ---- 5 -----------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "rejoined",
    [
        pytest.param(True, id="rejoined-then-partitioned"),
        pytest.param(
            False,
            id="never-connected",
        ),
    ],
)
def test_promoted_slave_opens_a_fresh_epoch(tmp_path: Path, rejoined: bool) -> None:
    """Row 4 (divergent tail) where the two terms start at the same offset: A (SYNC master) is
    killed with nothing unreplicated, B promoted (epoch e at X) and writes a tail nobody gets;
    A, restarted as B's slave (handshake done, then partitioned before any DATA), is promoted
    once B dies, and B rejoins as A's slave. A's term must not look like B's (e, X): B has to
    truncate its tail at X and end byte-identical to A."""
    name = "epoch-fresh-" + ("rejoined" if rejoined else "never-connected")
    with Drill(name, tmp_path) as drill:
        a = drill.node("a", slave_id=1)
        b = drill.node("b", slave_id=2)
        drill.start_group(a, "SYNC_MASTER", b)
        burst(drill.history, [a.address], "first", 200, 300, drill.rng)
        drill.wait_converged(a, [b])
        a.kill()
        doc_b = drill.promote(b)
        link = drill.relay(b.port + 1)
        if rejoined:
            a.start("SLAVE", ha_address=f"127.0.0.1:{link.port}")
            drill.wait_slave_in_sync(b)  # handshake done; B has written nothing in its term
            link.blackhole()
        burst(drill.history, [b.address], "b-tail", 100, 300, drill.rng, batch=50)
        b_max = b.status()["maxPhyOffset"]
        b.kill()
        if not rejoined:
            a.start("SLAVE", ha_address=f"127.0.0.1:{link.port}")  # B is gone: no handshake
        doc_a = drill.promote(a)
        if (doc_a["epoch"], doc_a["maxPhyOffset"]) == (doc_b["epoch"], doc_b["maxPhyOffset"]):
            # the same (epoch, start) as B's term: B would keep its divergent tail when it
            # rejoins (observed: reput_stopped "bad record header" at B's tail end)
            problem = f"A's term {doc_a['epoch']}@{doc_a['maxPhyOffset']} reuses B's term"
            drill.record({"b_tail_end": b_max}, [problem])
            pytest.fail(problem)
        burst(drill.history, [a.address], "a-new", 300, 200, drill.rng, batch=50)
        if not rejoined:
            # Two promotions that never heard of each other cannot be ordered without a
            # controller. The terms differ (epochs name the broker that opened them), so B
            # must refuse to follow A rather than keep or splice a divergent tail: A keeps
            # serving, B reports STALE_EPOCH and leaves its log alone for the operator.
            assert doc_a["epoch"] != doc_b["epoch"], (doc_a["epoch"], doc_b["epoch"])
            b_digest = commitlog_digest(b.store_root, 0, b_max, SEGMENT_BYTES)
            b.start("SLAVE", master=a)
            wait_for(lambda: "code=STALE_EPOCH" in b.log_text(), 30, "B to refuse A's term")
            assert b.status()["maxPhyOffset"] == b_max
            b.kill()
            assert commitlog_digest(b.store_root, 0, b_max, SEGMENT_BYTES) == b_digest
            assert a.status()["role"] != "SLAVE"
            drill.record({"a_term": [doc_a["epoch"], doc_a["maxPhyOffset"]],
                          "b_term": [doc_b["epoch"], doc_b["maxPhyOffset"]],
                          "b_refused": True}, [])
            return
        b.start("SLAVE", master=a)
        drill.wait_slave_in_sync(a)

        def checks(summary: dict[str, Any]) -> list[str]:
            summary.update(
                b_term=[doc_b["epoch"], doc_b["maxPhyOffset"]],
                a_term=[doc_a["epoch"], doc_a["maxPhyOffset"]],
                b_tail_end=b_max,
                a_epochs=[list(e) for e in epochs.load(a.store_root)],
            )
            # Without a controller neither term is "newer"; what matters is that they differ,
            # so that B's rejoin finds the divergence and truncates its tail (finish() checks
            # the logs are byte-identical and nothing acknowledged is lost).
            if doc_a["epoch"] == doc_b["epoch"]:
                return [f"A's term {summary['a_term']} reuses B's epoch {summary['b_term']}"]
            return []

        summary = drill.finish(a, [b], extra_checks=checks)
        assert summary["verdict"] == "pass", summary["problems"]
