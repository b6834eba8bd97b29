"""The store's extension points (common/store/extensions.py) on a real store: a put hook
rewrites or refuses a put in both flush modes, a record dispatcher gets exactly the records
carrying what it watches, a tags-code rule sets a topic's ConsumeQueue tagsCode, and the
master services start and stop through one switch. Delay levels use nothing else."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from common.core.config import load_config
from common.core.errors import PutStatus
from common.core.message import SCHEDULE_SOURCE, SCHEDULE_TOPIC, Message
from common.core.timer import TIMER_SOURCE
from common.core.transaction import HALF_ORIGIN
from common.store.commit_log import PutResult, refused
from common.store.extensions import DispatchRequest
from common.store.message_store import MessageStore
from common.store.schedule import DelayLevels
from common.store.timer.messages import TimerHook
from common.store.transaction.hook import HalfHook

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def _store(root: Path, flush: str = "ASYNC_FLUSH") -> MessageStore:
    return MessageStore(load_config(env={}, storePathRootDir=str(root), flushDiskType=flush,
                                    mappedFileSizeCommitLog=64 * 1024,
                                    mappedFileSizeConsumeQueue=20 * 1024))


class Renamer:
    """Stores every message of topic ``a`` in topic ``b``, queue 1; refuses topic ``no``."""

    name = "renamer"

    def before_put(self, msg: Message, queue_id: int) -> tuple[Message, int] | PutResult | None:
        if msg.topic == "no":
            return refused(PutStatus.MESSAGE_ILLEGAL, "topic no is refused by a hook")
        if msg.topic == "a":
            return Message("b", msg.body, properties=dict(msg.properties)), 1
        return None


class Watcher:
    name = "watcher"
    watches = ("COLOUR",)

    def __init__(self) -> None:
        self.seen: list[DispatchRequest] = []

    def dispatch(self, req: DispatchRequest) -> None:
        self.seen.append(req)


class Service:
    def __init__(self, name: str, events: list[str]):
        self.name, self.events = name, events

    def start(self) -> None:
        self.events.append(f"start {self.name}")

    def shutdown(self) -> None:
        self.events.append(f"stop {self.name}")


@pytest.fixture(params=["ASYNC_FLUSH", "SYNC_FLUSH"])
def store(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[MessageStore]:
    s = _store(tmp_path, request.param)
    s.extensions.add_put_hook(Renamer())
    s.start()
    yield s
    s.shutdown()


def test_a_put_hook_rewrites_a_message_before_it_is_appended(store: MessageStore) -> None:
    result = store.put(Message("a", b"moved"), 0)
    assert result.ok and result.queue_id == 1
    store.reput.catch_up()
    assert [m.body for m in store.get_message("g", "b", 1, 0, 8).messages()] == [b"moved"]
    assert store.cq_store.get("a", 0) is None
    pending = store.put_nowait(Message("a", b"again"), 0)
    assert store.wait_flushed(pending).queue_offset == 1


def test_a_put_hook_refuses_a_put_and_nothing_is_written(store: MessageStore) -> None:
    end = store.max_phy_offset
    for result in (store.put(Message("no", b"x"), 0),
                   store.wait_flushed(store.put_nowait(Message("no", b"x"), 0))):
        assert result.status is PutStatus.MESSAGE_ILLEGAL
        assert "refused by a hook" in result.remark
    assert store.max_phy_offset == end
    assert store.snapshot().put_failures == 2
    assert store.put(Message("c", b"untouched"), 2).ok  # the other topics pass as they are


def test_a_hook_may_not_claim_a_put_it_stopped_succeeded(tmp_path: Path) -> None:
    class Liar:
        name = "liar"

        def before_put(self, msg: Message, queue_id: int) -> PutResult:
            return PutResult(PutStatus.PUT_OK)

    s = _store(tmp_path)
    s.extensions.add_put_hook(Liar())
    s.start()
    try:
        with pytest.raises(Exception, match="liar returned PUT_OK"):
            s.put(Message("t", b"x"), 0)
    finally:
        s.shutdown()


def test_a_hook_with_triggers_sees_only_the_messages_that_carry_them(tmp_path: Path) -> None:
    """The common put skips the hooks with one set look-up: a hook that names its triggers
    is called for a message carrying one of them, or a delay level, and for no other; a hook
    without triggers sees every message."""

    class Counting:
        name = "counting"
        triggers = frozenset(("COLOUR",))

        def __init__(self) -> None:
            self.seen: list[bytes] = []

        def before_put(self, msg: Message, queue_id: int) -> None:
            self.seen.append(msg.body)

    s = _store(tmp_path)
    counting = Counting()
    s.extensions.add_put_hook(counting)
    s.start()
    try:
        for put in (s.put, lambda m, q: s.wait_flushed(s.put_nowait(m, q))):
            counting.seen.clear()
            assert put(Message("t", b"plain", properties={"OTHER": "1"}), 0).ok
            assert put(Message("t", b"coloured", properties={"COLOUR": "red"}), 0).ok
            assert put(Message("t", b"delayed", delay_level=2), 0).ok
            assert counting.seen == [b"coloured", b"delayed"]
        assert s.extensions.put_hook_triggers is not None
        s.extensions.add_put_hook(Renamer())  # no triggers: every message from now on
        assert s.extensions.put_hook_triggers is None
        counting.seen.clear()
        assert s.put(Message("a", b"plain"), 0).queue_id == 1
        assert counting.seen == [b"plain"]
    finally:
        s.shutdown()


def test_a_dispatcher_gets_the_records_carrying_what_it_watches(tmp_path: Path) -> None:
    s = _store(tmp_path)
    watcher = Watcher()
    s.extensions.add_dispatcher(watcher)
    s.start()
    try:
        s.put(Message("t", b"plain"), 0)
        s.put(Message("t", b"tagged", tags="x"), 0)
        red = s.put(Message("t", b"red", properties={"COLOUR": "red"}), 0)
        s.put(Message("t", b"other", properties={"SHAPE": "round"}), 0)
        s.reput.catch_up()
        colours = [r for r in watcher.seen if "COLOUR" in r.properties]
        assert [(r.phy_offset, r.properties["COLOUR"]) for r in colours] == [
            (red.phy_offset, "red")]
        # what the dispatcher was given for it is what the record holds
        assert colours[0].queue_offset == 2 and colours[0].topic == "t"
        assert all("SHAPE" not in r.properties for r in watcher.seen)
    finally:
        s.shutdown()


def test_a_tags_code_rule_sets_its_topics_consume_queue_tags_code(tmp_path: Path) -> None:
    s = _store(tmp_path)

    def due(props: Mapping[str, str], store_ts: int, tag_hash: int) -> int:
        return int(props["DUE"]) if "DUE" in props else tag_hash

    s.extensions.add_tags_code_rule("timed", due, watches=("DUE",))
    s.start()
    try:
        s.put(Message("timed", b"x", properties={"DUE": "123456"}), 0)
        s.put(Message("untimed", b"x", properties={"DUE": "123456"}), 0)
        s.reput.catch_up()
        timed = store_entry(s, "timed")
        untimed = store_entry(s, "untimed")
        assert timed == 123456 and untimed == 0
    finally:
        s.shutdown()


def store_entry(s: MessageStore, topic: str) -> int:
    cq = s.cq_store.get(topic, 0)
    assert cq is not None
    entry = cq.get(0)
    assert entry is not None
    return entry[2]


def test_master_services_start_and_stop_through_one_switch(tmp_path: Path) -> None:
    s = MessageStore(load_config(env={}, storePathRootDir=str(tmp_path)),
                     start_master_services=False)
    events: list[str] = []
    made: list[Service] = []

    def factory(name: str):  # type: ignore[no-untyped-def]
        def make() -> Service:
            made.append(Service(name, events))
            return made[-1]
        return make

    s.extensions.add_master_service("one", factory("one"))
    s.extensions.add_master_service("two", factory("two"))
    with pytest.raises(ValueError, match="registered already"):
        s.extensions.add_master_service("one", factory("one"))
    s.start()
    try:
        assert events == [] and s.master_services_running == []
        s.become_master()
        assert events == ["start one", "start two"]
        assert s.master_services_running == ["transaction-fresh", "transaction-op-batch",
                                             "schedule", "timer-dequeue", "pop-tail", "one",
                                             "two"]
        s.become_slave()
        assert events[2:] == ["stop two", "stop one"] and s.master_services_running == []
        s.set_master_services(True)  # a thread starts once: each start makes a new service
        assert len(made) == 4 and made[2] is not made[0]
    finally:
        s.shutdown()
    assert events[-2:] == ["stop two", "stop one"]


def test_delay_levels_and_the_timer_are_registered_extensions_only(tmp_path: Path) -> None:
    """The put path and reput name no special topic: transactions are one put hook (first: a
    half is never delayed), one cut listener, one indexed property and two master services;
    delay levels one put hook, one tags-code rule, one indexed property and one master
    service; the timer one put hook (after delay levels': a level wins), one dispatcher, one
    cut listener, one indexed property, one store service and one master service; POP one
    dispatcher, one cut listener, one store service and one master service."""
    s = _store(tmp_path)
    ext = s.extensions
    assert [type(h) for h in ext.put_hooks] == [HalfHook, DelayLevels, TimerHook]
    assert list(ext.tags_code_rules) == [SCHEDULE_TOPIC]
    assert list(ext.master_services) == ["transaction-fresh", "transaction-op-batch", "schedule",
                                         "timer-dequeue", "pop-tail"]
    assert list(ext.services) == ["timer", "pop"] and s.timer in ext.dispatchers
    assert s.pop in ext.dispatchers
    assert ext.cut_listeners == [s.transactions, s.timer, s.pop]
    assert s.index_dispatcher is not None
    assert s.index_dispatcher.watches == (HALF_ORIGIN, SCHEDULE_SOURCE, TIMER_SOURCE)
    s.start()
    try:
        result = s.put(Message("real", b"later", delay_level=2), 3)
        assert result.ok and result.queue_id == 1  # level 2's schedule queue
        s.reput.catch_up()
        cq = s.cq_store.get(SCHEDULE_TOPIC, 1)
        assert cq is not None
        entry = cq.get(0)
        assert entry is not None and entry[2] == result.store_timestamp + s.delay_levels_ms[1]
    finally:
        s.shutdown()
