"""What the console shows, read from the cluster on one thread ("replog-console-poll").

Every ``refresh_s`` it asks one broker for CLUSTER_INFO (in controller mode, the controller's
view of ZooKeeper: every group's master, epoch and SyncStateSet) and each member for STATUS,
the same requests ``replog status --cluster`` makes: at most ``CONCURRENCY`` at a time, each
bounded by the client's timeout, so a console never piles requests onto a broker, and a
broker that does not answer is shown as unreachable, never waited on twice in one round.

It keeps the last snapshot (``snapshot``), an hour of each group's figures (``history``: put
and get rates, the largest replication lag of its slaves in bytes), and a timeline of what
changed between two rounds (``timeline``): a group's master or epoch, its SyncStateSet, a
member becoming unreachable or reachable again, a group appearing or going.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from common.client import Admin
from common.core.errors import BrokerError
from common.core.logs import log_event

log = logging.getLogger("replog.console")

CONCURRENCY = 4  # STATUS requests in flight at once, over the whole cluster
STATUS_WAIT = 0.8  # of a round: how long its STATUS answers are waited for
HISTORY_S = 3600
TIMELINE_MAX = 1000
STATUS_KEYS = ("role", "epoch", "brokerId", "maxPhyOffset", "minPhyOffset", "putTps",
               "getTps", "putTotal", "inflight", "fencedWrites", "diskUsedRatio",
               "commitLogBytes", "putLatencyP99Ms", "flushLagBytes", "reputLagBytes",
               "uptimeS", "epochHistory", "consumerLag")


class Collector:
    def __init__(self, admin: Admin, refresh_s: float = 2.0,
                 clock: Callable[[], float] = time.time):
        self.admin = admin
        self.refresh_s = refresh_s
        self.clock = clock
        self.lock = threading.Lock()
        self.snapshot: dict[str, Any] = {"cluster": "", "groups": [], "updatedAtMs": 0,
                                         "error": "not read yet"}
        points = max(2, int(HISTORY_S / refresh_s))
        self.history: dict[str, collections.deque[dict[str, Any]]] = \
            collections.defaultdict(lambda: collections.deque(maxlen=points))
        self.timeline: collections.deque[dict[str, Any]] = collections.deque(maxlen=TIMELINE_MAX)
        # consumer group -> its lag and consumption over the whole cluster, an hour of rounds
        self.consumer_history: dict[str, collections.deque[dict[str, Any]]] = \
            collections.defaultdict(lambda: collections.deque(maxlen=points))
        self.rounds = 0
        self._known: dict[str, dict[str, None]] = {}  # group -> every member address seen
        self._answered = ""  # the broker whose CLUSTER_INFO was read last
        self._last_statuses: dict[str, dict[str, Any] | str] = {}
        self._final: dict[str, Any] = {"groups": []}  # the last round's, members' figures in
        self._ends: dict[str, collections.deque[tuple[int, int]]] = {}  # group: (ms, master end)
        self._asked: dict[str, concurrent.futures.Future[dict[str, Any]]] = {}  # STATUS out
        self._pool = concurrent.futures.ThreadPoolExecutor(CONCURRENCY, "replog-console-status")
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="replog-console-poll",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        self._pool.shutdown(wait=True, cancel_futures=True)

    def refresh_now(self) -> None:
        """Read again at once (after a change made from the console)."""
        self._wake.set()

    def _run(self) -> None:
        """A round every ``refresh_s`` on a fixed schedule (a slow round shortens the pause
        after it, never moves the next one later than its time, unless it overran it)."""
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - one bad round is shown, never fatal
                log_event(log, "console_poll_failed", logging.WARNING, error=repr(e))
                with self.lock:
                    self.snapshot = {**self.snapshot, "error": f"{type(e).__name__}: {e}"}
            due = max(due + self.refresh_s, time.monotonic())
            if self._wake.wait(max(0.0, due - time.monotonic())):
                due = time.monotonic()  # asked for a round now: the schedule starts again
            self._wake.clear()

    # ---- one round ------------------------------------------------------------------------------
    def poll(self) -> dict[str, Any]:
        now_ms = int(self.clock() * 1000)
        try:
            info = self._cluster_info()
        except BrokerError as e:
            with self.lock:
                self.snapshot = {**self.snapshot, "error": f"no broker answered: {e.remark}",
                                 "updatedAtMs": now_ms}
            return self.snapshot
        for g in info.get("groups", []):  # a member seen once stays shown (down: unreachable)
            known = self._known.setdefault(g["brokerName"], {})
            known.update(dict.fromkeys(_addresses(g)))
            g["knownMembers"] = list(known)
        addresses = [a for g in info.get("groups", []) for a in g["knownMembers"]]
        ordered = sorted(info.get("groups", []), key=lambda g: g["brokerName"])
        # first what CLUSTER_INFO says (a new master, epoch, SyncStateSet: shown at once, with
        # the members' figures of the last round), then the members' STATUS
        with self.lock:
            early = {"cluster": info.get("cluster", ""),
                     "controller": info.get("controller", False),
                     "groups": [self._group(g, self._last_statuses) for g in ordered],
                     "updatedAtMs": now_ms, "error": ""}
            self._changes(self.snapshot, early, now_ms, members=False)
            self.snapshot = early
        statuses = self._statuses(addresses)
        snapshot = {**early, "groups": [self._group(g, statuses) for g in ordered]}
        for g in snapshot["groups"]:
            self._lag_in_time(g, now_ms)
        consumers = _consumers(snapshot["groups"])
        with self.lock:
            self._changes(self._final, snapshot, now_ms, groups=False)
            self._final = snapshot
            for g in snapshot["groups"]:
                self.history[g["brokerName"]].append(_point(g, now_ms))
            for name, figures in consumers.items():
                points = self.consumer_history[name]
                rate = 0.0
                if points and now_ms > points[-1]["atMs"]:
                    rate = max(0, figures["committed"] - points[-1]["committed"]) * 1000 / \
                        (now_ms - points[-1]["atMs"])
                points.append({"atMs": now_ms, "lag": figures["lag"],
                               "committed": figures["committed"], "ratePerS": round(rate, 1)})
            self.snapshot = snapshot
            self._last_statuses = statuses
            self.rounds += 1
        return snapshot

    def _statuses(self, addresses: list[str]) -> dict[str, dict[str, Any] | str]:
        """STATUS of each member, waited at most most of a round (``STATUS_WAIT`` of
        ``refresh_s``): a member whose answer has not come by then keeps what it showed last
        round (its request, bounded by the client's timeout, stays out, and it is not asked
        again meanwhile); it is shown unreachable once that request fails. A dead broker never
        holds a round, nor gets a pile of requests."""
        for address in addresses:
            pending = self._asked.get(address)
            if pending is None or pending.done():
                self._asked[address] = self._pool.submit(self.admin.status, address)
        futures = {a: self._asked[a] for a in addresses}
        concurrent.futures.wait(futures.values(), timeout=STATUS_WAIT * self.refresh_s)
        statuses: dict[str, dict[str, Any] | str] = {}
        for address, future in futures.items():
            if not future.done():
                last = self._last_statuses.get(address)
                if last is not None:
                    statuses[address] = last
                continue
            try:
                statuses[address] = future.result()
            except BrokerError as e:
                statuses[address] = e.remark or e.code.name
            except concurrent.futures.CancelledError:
                statuses[address] = "stopped"
        return statuses

    def _cluster_info(self) -> dict[str, Any]:
        """CLUSTER_INFO of a broker that answers with groups: two asked at once (the one read
        last time and the next member known), the first good answer taken, so a broker that
        just died costs a round nothing; then the others in turn."""
        order = [a for a in dict.fromkeys([self._answered, *self._members_seen(),
                                           *self.admin.servers]) if a]
        first, rest = order[:2], order[2:]
        last: BrokerError | None = None
        futures = [self._pool.submit(self.admin.cluster_info, a) for a in first]
        for future in concurrent.futures.as_completed(futures):
            try:
                info = future.result()
            except BrokerError as e:
                last = e
                continue
            if info.get("groups"):
                self._answered = first[futures.index(future)]
                return info
        for address in rest:
            try:
                info = self.admin.cluster_info(address)
            except BrokerError as e:
                last = e
                continue
            if info.get("groups"):
                self._answered = address
                return info
        raise last or BrokerError("SYSTEM_ERROR", "no broker knows a group yet", True)

    def _members_seen(self) -> list[str]:
        return [a for known in self._known.values() for a in known]

    @staticmethod
    def _group(g: dict[str, Any], statuses: dict[str, dict[str, Any] | str]) -> dict[str, Any]:
        members: list[dict[str, Any]] = []
        for address in g.get("knownMembers") or _addresses(g):
            st = statuses.get(address)
            if isinstance(st, dict):
                members.append({"address": address, "reachable": True,
                                **{k: st.get(k) for k in STATUS_KEYS},
                                "slaves": st.get("slaves") or []})
            elif st is None:  # not asked yet (a round's first look): neither up nor down
                members.append({"address": address, "reachable": None, "error": ""})
            else:
                members.append({"address": address, "reachable": False, "error": st})
        master: dict[str, Any] = next(
            (m for m in members if m["address"] == g.get("master")), {})
        lags = [s.get("lagBytes") or 0 for s in master.get("slaves") or []]
        return {"brokerName": g["brokerName"], "master": g.get("master") or "",
                "masterEpoch": g.get("masterEpoch", 0),
                "syncStateSet": g.get("syncStateSet") or [],
                "topics": len(g.get("topics") or {}), "members": members,
                "putTps": master.get("putTps"), "getTps": master.get("getTps"),
                "replicationLagBytes": max(lags) if lags else 0, "replicationLagMs": 0,
                "terms": _terms(master.get("epochHistory") or [])}

    def _lag_in_time(self, group: dict[str, Any], now_ms: int) -> None:
        """Each slave's lag in time: how long ago the master's log ended where the slave's
        acknowledged offset is now (from the master's end offset at each round: an upper
        bound, to a round; None past the hour kept)."""
        master = next((m for m in group["members"] if m["address"] == group["master"]
                       and m["reachable"]), None)
        if master is None or master.get("maxPhyOffset") is None:
            return
        samples = self._ends.setdefault(group["brokerName"], collections.deque(
            maxlen=max(2, int(HISTORY_S / self.refresh_s))))
        samples.append((now_ms, int(master["maxPhyOffset"])))
        worst: int | None = 0
        for slave in master.get("slaves") or []:
            ack = int(slave.get("ackOffset") or 0)
            if ack >= samples[-1][1]:
                slave["lagMs"] = 0
                continue
            since = next((at for at, end in reversed(samples) if end <= ack), None)
            slave["lagMs"] = None if since is None else now_ms - since
            worst = None if worst is None or slave["lagMs"] is None else \
                max(worst, slave["lagMs"])
        group["replicationLagMs"] = worst

    def _changes(self, old: dict[str, Any], new: dict[str, Any], now_ms: int,
                 groups: bool = True, members: bool = True) -> None:
        """Timeline entries for what differs: ``groups`` (appearing, going, master, epoch,
        SyncStateSet), ``members`` (answering or not)."""
        if not self.rounds:
            return  # the first round is the baseline, not a change
        before = {g["brokerName"]: g for g in old.get("groups", [])}
        after = {g["brokerName"]: g for g in new.get("groups", [])}
        if groups:
            for name in sorted(after.keys() - before.keys()):
                self._event(now_ms, name, "group", f"group {name} appeared")
            for name in sorted(before.keys() - after.keys()):
                self._event(now_ms, name, "group", f"group {name} is gone")
        for name in sorted(after.keys() & before.keys()):
            a, b = before[name], after[name]
            if groups and (a["master"], a["masterEpoch"]) != (b["master"], b["masterEpoch"]):
                what = (f"master {a['master'] or 'none'} -> {b['master'] or 'none'}, epoch "
                        f"{a['masterEpoch']} -> {b['masterEpoch']}")
                self._event(now_ms, name, "election", what)
            if groups and a["syncStateSet"] != b["syncStateSet"]:
                self._event(now_ms, name, "syncStateSet", f"SyncStateSet {a['syncStateSet']} "
                            f"-> {b['syncStateSet']}")
            reach = {m["address"]: m["reachable"] for m in a["members"]} if members else {}
            for m in b["members"]:
                was = reach.get(m["address"])
                if was is not None and m["reachable"] is not None and was != m["reachable"]:
                    self._event(now_ms, name, "member", f"{m['address']} "
                                f"{'answers again' if m['reachable'] else 'does not answer'}")

    def _event(self, at_ms: int, group: str, kind: str, text: str) -> None:
        self.timeline.append({"atMs": at_ms, "group": group, "kind": kind, "text": text})
        log_event(log, "console_change", group=group, kind=kind, text=text)

    # ---- what the pages read ------------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        with self.lock:
            return {**self.snapshot, "refreshMs": int(self.refresh_s * 1000),
                    "timeline": list(self.timeline)[-200:][::-1]}

    def series(self) -> dict[str, list[dict[str, Any]]]:
        with self.lock:
            return {name: list(points) for name, points in self.history.items()}

    def consumer_series(self) -> dict[str, list[dict[str, Any]]]:
        """Consumer group -> ``{atMs, lag, committed, ratePerS}`` per round (the masters'
        offset tables: lag in messages, consumed per second since the round before)."""
        with self.lock:
            return {name: list(points) for name, points in self.consumer_history.items()}


def _addresses(group: dict[str, Any]) -> list[str]:
    """The group's members: its master, its slaves, and in controller mode every member
    ZooKeeper knows (a member that is down is still one)."""
    seen: dict[str, None] = {}
    for address in [group.get("master") or "", *(group.get("slaves") or [])]:
        if address:
            seen[address] = None
    for record in (group.get("members") or {}).values():
        address = record.get("address") if isinstance(record, dict) else None
        if address:
            seen[address] = None
    return list(seen)


def _terms(history: list[list[int]]) -> list[dict[str, Any]]:
    """The master's epoch file as the group's elections, newest first: each term's epoch, the
    member that opened it (the epoch's low 8 bits) and the log offset it began writing at."""
    return [{"epoch": epoch, "memberId": epoch & 0xFF, "startOffset": start}
            for epoch, start in reversed(history)]


def _consumers(groups: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Each consumer group's lag and committed total over the broker groups' masters."""
    out: dict[str, dict[str, int]] = {}
    for g in groups:
        master = next((m for m in g["members"] if m["address"] == g["master"]
                       and m["reachable"]), None)
        for name, figures in ((master or {}).get("consumerLag") or {}).items():
            mine = out.setdefault(name, {"lag": 0, "committed": 0})
            mine["lag"] += int(figures.get("lag", 0))
            mine["committed"] += int(figures.get("committed", 0))
    return out


def _point(g: dict[str, Any], now_ms: int) -> dict[str, Any]:
    return {"atMs": now_ms, "putTps": g["putTps"] or 0.0, "getTps": g["getTps"] or 0.0,
            "lagBytes": g["replicationLagBytes"], "lagMs": g.get("replicationLagMs")}
