"""The store's extension points, RocketMQ 5's: put hooks, record dispatchers, tags-code rules
and the services only a master runs. A feature that gives a topic a meaning of its own (delay
levels today; timers, transactions, filters next) is one module that registers here, and the
CommitLog, reput and the put path never name its topic.

- **Put hooks** (``PutMessageHook``) run in order before a single message is appended. A hook
  returns None (store it as it is), a ``(message, queue id)`` to store instead (a delayed
  message goes to the schedule topic), or a refused ``PutResult`` (nothing is written, the
  producer gets its status). Batches do not pass them: the master refuses a batch that holds a
  message a hook would rewrite.
- **Record dispatchers** (``CommitLogDispatcher``): reput gives each, in order, the
  ``DispatchRequest`` of every record that carries one of the properties some dispatcher
  ``watches`` (its topic, queue, offsets, tagsCode, store time, index keys and properties);
  the IndexFile's is first. A record without any is dispatched in runs straight to its
  ConsumeQueue (in C where built): most of a busy log, and nothing a dispatcher reads. A
  dispatcher may see a record twice (a retried pass, a re-dispatch after a crash) and must
  come to the same state; it runs on reput's thread or on a request loop dispatching inline.
- **Tags-code rules**: a topic whose ConsumeQueue tagsCode is not its tag's hash (the
  schedule topic's is the delivery time, which its queue is walked by).
- **Master services**: made and started when the store becomes a master's, stopped when it
  stops being one (a thread cannot start twice, so each start makes a new one).
- **Store services**: run by every store, master or slave, from its start (after recovery and
  reput's catch-up) to its shutdown (before the CommitLog closes): a timer's enqueue and
  checkpoint threads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple, Protocol

from common.core.message import (
    NAME_VALUE_SEP,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    Message,
)

if TYPE_CHECKING:
    from common.store.commit_log import PutResult

NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})


class DispatchRequest(NamedTuple):
    """What a record contributes to the indexes (RocketMQ DispatchRequest)."""

    topic: str
    queue_id: int
    queue_offset: int
    phy_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    keys: tuple[str, ...]  # KEYS and UNIQ_KEY: what the IndexFile holds for every record
    properties: Mapping[str, str] = NO_PROPERTIES  # decoded only when a watched one is there


class PutHook(Protocol):
    name: str
    # the properties that make it act (it also sees every message with a delay level); a
    # hook without ``triggers`` sees every message. A message carrying none of the hooks'
    # triggers and no delay level passes them all with one set look-up (the common put).
    triggers: frozenset[str]

    def before_put(self, msg: Message, queue_id: int) -> tuple[Message, int] | PutResult | None:
        """None: unchanged; (message, queue id): store that instead; a PutResult: refused."""
        ...


class RecordDispatcher(Protocol):
    name: str
    watches: tuple[str, ...]  # the properties it reads: a record with none of them skips it

    def dispatch(self, req: DispatchRequest) -> None: ...


class MasterService(Protocol):
    def start(self) -> None: ...

    def shutdown(self) -> None: ...


class CutListener(Protocol):
    """Told when the CommitLog is cut back (``truncate_to``: a member rejoining its group) or
    emptied (``reset_to``: a slave far behind), under reput's lock, after the ConsumeQueues
    and the index are cut: what it took from the records that are gone must go too."""

    def on_truncate(self, phy_offset: int) -> None: ...

    def on_reset(self, phy_offset: int) -> None: ...


TagsCodeRule = Callable[[Mapping[str, str], int, int], int]  # properties, store time, tag hash

# what the built-in dispatch reads: the tag's hash, the IndexFile's keys
_BUILT_IN_WATCHES = (PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY)


class StoreExtensions:
    """The registry a store is built with; features register before the store starts."""

    def __init__(self) -> None:
        self.put_hooks: list[PutHook] = []
        # every put hook's triggers together; None once a hook sees every message
        self.put_hook_triggers: frozenset[str] | None = frozenset()
        self.dispatchers: list[RecordDispatcher] = []
        self.tags_code_rules: dict[str, TagsCodeRule] = {}
        self.rule_topics: tuple[bytes, ...] = ()  # their topics, encoded (reput's C scan)
        self.master_services: dict[str, Callable[[], MasterService]] = {}
        self.services: dict[str, MasterService] = {}  # every store's, master or slave
        self.cut_listeners: list[CutListener] = []
        self._watched: list[str] = list(_BUILT_IN_WATCHES)
        # "NAME\x01" of each watched property: a record whose raw properties hold none of
        # these has nothing to decode (most records with properties carry only these few)
        self.markers: tuple[bytes, ...] = ()
        self._update_markers()

    def add_put_hook(self, hook: PutHook) -> None:
        self.put_hooks.append(hook)
        triggers = getattr(hook, "triggers", None)
        if triggers is None or self.put_hook_triggers is None:
            self.put_hook_triggers = None
        else:
            self.put_hook_triggers = self.put_hook_triggers | triggers

    def add_dispatcher(self, dispatcher: RecordDispatcher) -> None:
        self.dispatchers.append(dispatcher)
        self.watch(*dispatcher.watches)

    def add_tags_code_rule(self, topic: str, rule: TagsCodeRule, watches: tuple[str, ...]) -> None:
        """``rule`` gives the tagsCode of the records of ``topic`` that carry ``watches``."""
        if topic in self.tags_code_rules:
            raise ValueError(f"topic {topic} has a tags-code rule already")
        self.tags_code_rules[topic] = rule
        self.rule_topics = tuple(t.encode() for t in self.tags_code_rules)
        self.watch(*watches)

    def add_master_service(self, name: str, factory: Callable[[], MasterService]) -> None:
        if name in self.master_services:
            raise ValueError(f"a master service named {name} is registered already")
        self.master_services[name] = factory

    def add_service(self, name: str, service: MasterService) -> None:
        if name in self.services:
            raise ValueError(f"a store service named {name} is registered already")
        self.services[name] = service

    def add_cut_listener(self, listener: CutListener) -> None:
        self.cut_listeners.append(listener)

    def watch(self, *properties: str) -> None:
        """Decode the properties of records that carry any of these."""
        for name in properties:
            if name not in self._watched:
                self._watched.append(name)
        self._update_markers()

    def _update_markers(self) -> None:
        self.markers = tuple((name + NAME_VALUE_SEP).encode() for name in self._watched)
