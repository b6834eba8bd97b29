"""A master's lease does not run out while ZooKeeper answers, however long a controller pass
spends in other calls; and a renewal's answer confirms nothing it should not.

A loaded run of the two-group drill (tests/drills/test_cluster_drills.py) once saw the healthy
group's master refuse a write, "lease is not fresh", with ZooKeeper up and no suspension: the
renewal was the member znode write, made once a second *after* the last one returned, on the one
controller thread that also reads the whole cluster on every watch. Behind a slow pass (the other
group failing over, a loaded process) the 1.5 s lease ran out. Renewals now go every third of the
lease from when the last was sent, without waiting, and before any other call of a pass.

A fake kazoo client here: reads take a set time on the calling thread, as a loaded ZooKeeper round
trip does; writes answer on another thread (kazoo's callback thread)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Self

import pytest
from kazoo.exceptions import NoNodeError

from common.broker.controller import Controller
from common.core.config import load_config
from common.ha.controller_core import MemberRecord

pytestmark = pytest.mark.unit

SESSION = (0x1234, b"password")
LEASE_S = 1.5  # half of the 3 s session


class Result:
    """A kazoo IAsyncResult: a value or an exception, ready after ``delay_s``."""

    def __init__(self, value: Any = None, error: Exception | None = None, delay_s: float = 0.0):
        self._value, self._error = value, error
        self._ready = threading.Event()
        self._callbacks: list[Callable[[Result], None]] = []
        self._lock = threading.Lock()
        threading.Timer(delay_s, self._finish).start()

    def _finish(self) -> None:
        with self._lock:
            self._ready.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def get(self, timeout: float | None = None) -> Any:
        if not self._ready.wait(timeout):
            raise TimeoutError("fake call timed out")
        return self.get_nowait()

    def get_nowait(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def rawlink(self, cb: Callable[[Result], None]) -> None:
        with self._lock:
            if not self._ready.is_set():
                self._callbacks.append(cb)
                return
        cb(self)


class SlowZooKeeper:
    """Every read takes ``read_s``; a write answers after ``write_s``. The cluster has
    ``groups`` other groups with nothing in them (each read of one is a few calls)."""

    def __init__(self, read_s: float, write_s: float = 0.01, groups: int = 3):
        self.read_s, self.write_s = read_s, write_s
        self.groups = [f"group-{i}" for i in range(groups)]
        self.client_id = SESSION
        self.writes: list[float] = []
        self.write_error: Exception | None = None

    def get_children_async(self, path: str, watch: Any = None) -> Result:
        names = self.groups if path.count("/") == 2 else []  # /replog/<cluster>: the groups
        return Result(names, delay_s=self.read_s)

    def get_async(self, path: str, watch: Any = None) -> Result:
        return Result(error=NoNodeError(), delay_s=self.read_s)

    def exists_async(self, path: str, watch: Any = None) -> Result:
        return Result(None, delay_s=self.read_s)

    def set_async(self, path: str, raw: bytes) -> Result:
        self.writes.append(time.monotonic())
        return Result(None, error=self.write_error, delay_s=self.write_s)


class Broker:
    def __init__(self) -> None:
        self.stood_by: list[str] = []

    def local_record(self, incarnation: str) -> MemberRecord:
        return MemberRecord(1, "127.0.0.1:10911", "127.0.0.1:10912", "MASTER", 1, 100, 100,
                            incarnation=incarnation)

    def stand_by(self, reason: str) -> None:
        self.stood_by.append(reason)


def master(zk: SlowZooKeeper) -> Controller:
    """A controller that won its election in SESSION, its lease confirmed just now."""
    cfg = load_config(env={}, enableControllerMode=True, brokerId=1, brokerRole="SYNC_MASTER",
                      controllerAddr="zk1:2181/replog", controllerSessionTimeoutMs=3000)
    c = Controller(cfg, Broker())  # type: ignore[arg-type]
    assert c.lease.duration_s == LEASE_S
    c._zk, c._session, c._mastered = zk, SESSION, (SESSION[0], 1)
    c._registered, c.connected = True, True
    now = time.monotonic()
    c.lease.confirm(now, c.lease.generation)
    c._renew_due = now + LEASE_S / 3
    return c


class Watch:
    """Samples ``lease.fresh`` every 5 ms on its own thread (the I/O thread's view)."""

    def __init__(self, c: Controller):
        self.c = c
        self.stale: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            now = time.monotonic()
            if not self.c.lease.fresh(now):
                self.stale.append(now)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def zk() -> Iterator[SlowZooKeeper]:
    yield SlowZooKeeper(read_s=0.25)


@pytest.mark.timeout(30)
def test_a_pass_spent_in_slow_reads_keeps_the_lease(zk: SlowZooKeeper) -> None:
    c = master(zk)
    started = time.monotonic()
    with Watch(c) as watch:
        c._read_cluster()  # 3 groups x 5 reads + 1, 250 ms each: 4 s on this thread
    spent = time.monotonic() - started
    assert spent > 2 * LEASE_S  # the pass outlasted the lease twice over
    assert watch.stale == []
    gaps = [b - a for a, b in zip([started, *zk.writes], zk.writes, strict=False)]
    # every third of it, plus a read (0.75 s): measured 0.50-0.52 s, quiet or beside four
    # busy loops on 2 cores (docs/drills.md), so the bound keeps half a second of room
    assert gaps and max(gaps) < LEASE_S * 2 / 3
    assert c.stats.lease_lapses == 0


@pytest.mark.timeout(30)
def test_renewals_go_out_without_waiting_for_a_slow_answer() -> None:
    zk = SlowZooKeeper(read_s=0.05, write_s=0.8)  # each write answers 0.8 s after it was sent
    c = master(zk)
    with Watch(c) as watch:
        deadline = time.monotonic() + 3 * LEASE_S
        while time.monotonic() < deadline:  # the controller thread's timer checks
            c._renew_lease()
            time.sleep(0.05)
    # waiting 0.8 s for each answer before the next write would leave 1.3 s between confirmed
    # sends, and the answer 0.8 s after that: the lease would lapse for about 0.6 s each time
    assert watch.stale == [] and c.stats.lease_lapses == 0
    assert len(zk.writes) >= 8  # one every 0.5 s for 4.5 s


def test_a_renewal_sent_before_a_suspension_confirms_nothing() -> None:
    zk = SlowZooKeeper(read_s=0.01, write_s=0.3)
    c = master(zk)
    c._renew_due = 0.0
    c._renew_lease()  # sent; its answer comes in 0.3 s
    c._on_connection("SUSPENDED")  # kazoo's listener: the lease ends at once
    c.connected = True  # the same session reconnects before the answer arrives
    time.sleep(0.5)
    assert not c.lease.fresh(time.monotonic())  # a write sent before cannot vouch for after


def test_a_renewal_after_losing_mastership_confirms_nothing() -> None:
    zk = SlowZooKeeper(read_s=0.01, write_s=0.3)
    c = master(zk)
    c.lease.expire()
    c._renew_due = 0.0
    c._renew_lease()
    c._lose_mastership("the state names another master")
    time.sleep(0.5)
    assert not c.lease.fresh(time.monotonic())


def test_a_lapse_ended_by_a_renewal_is_counted() -> None:
    zk = SlowZooKeeper(read_s=0.01, write_s=0.01)
    c = master(zk)
    c.lease.expire()
    c.lease.confirm(time.monotonic() - 2 * LEASE_S, c.lease.generation)  # confirmed long ago: stale now
    assert not c.lease.fresh(time.monotonic())
    c._renew_due = 0.0
    c._renew_lease()
    deadline = time.monotonic() + 5
    while not c.lease.fresh(time.monotonic()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert c.lease.fresh(time.monotonic()) and c.stats.lease_lapses == 1


def test_a_master_whose_member_znode_is_gone_steps_down_and_registers_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    zk = SlowZooKeeper(read_s=0.01, write_s=0.01)
    zk.write_error = NoNodeError()
    c = master(zk)
    c.lease.expire()
    c._renew_due = 0.0
    c._renew_lease()
    assert c._events.get(timeout=5) == ("member_gone", None)
    assert not c.lease.fresh(time.monotonic())  # a failed write confirms nothing
    published: list[bool] = []
    monkeypatch.setattr(c, "_publish_member", lambda: published.append(c._registered))
    monkeypatch.setattr(c, "_read_group", lambda: None)
    monkeypatch.setattr(c, "_reconcile", lambda: None)
    monkeypatch.setattr(c, "_publish_topics", lambda: None)
    monkeypatch.setattr(c, "_read_cluster", lambda: None)
    c._handle("member_gone", None)
    assert published == [False]  # the pass creates the member znode again
    # someone deleted it while the session lives: the others may elect another master now,
    # so this one writes nothing more until an election names it again
    assert c._mastered is None and not c.lease.fresh(time.monotonic())
    assert c.broker.stood_by == ["its member znode was deleted: registering again"]  # type: ignore[attr-defined]
