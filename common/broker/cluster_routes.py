"""The cluster-wide route view of controller mode: every broker group's ``state``, live
members and topics as ZooKeeper holds them, which ``CLUSTER_INFO`` answers are made from, and
the topic table a group's master publishes there.

It is the controller driver's other half (``common/broker/controller.py`` keeps the election,
the lease and the SyncStateSet): it makes its ZooKeeper calls through the driver's ``call``
(on the controller thread, each with its deadline and the lease renewal ahead of it) and
never decides anything about its own group. Watches on the list of groups and on every other
group's ``state``, members and ``topics`` keep the view fresh: a fired one (``on_watch``, a
kazoo thread) asks the controller thread to read the cluster view again, not this group's
decisions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from common.core.logs import log_event
from common.ha import controller_core as cc
from common.ha.controller_core import GroupState, GroupView, MemberRecord

log = logging.getLogger("replog.controller")

Call = Callable[..., Any]  # call(method, *args, **kwargs): a kazoo call with its deadline


class ClusterRoutes:
    def __init__(self, cluster_path: str, own_group: str, call: Call,
                 on_watch: Callable[..., None]):
        self.cluster_path = cluster_path
        self.own_group = own_group
        self.topics_path = f"{cluster_path}/{own_group}/topics"
        self._call = call
        self._on_watch = on_watch
        self._lock = threading.Lock()
        self._view: dict[str, GroupView] = {}
        self._published: tuple[dict[str, int], dict[str, int]] | None = None

    def view(self) -> dict[str, GroupView]:
        """Every broker group of this cluster as last read (any thread)."""
        with self._lock:
            return dict(self._view)

    # ---- the controller thread ----------------------------------------------------------------
    def publish_topics(self, topics: dict[str, int], perms: dict[str, int]) -> None:
        """A master keeps ``<group>/topics`` equal to its topic table (routes read it)."""
        from kazoo.exceptions import NodeExistsError, NoNodeError

        if (topics, perms) == self._published:
            return
        raw = cc.encode_topics(topics, perms)
        try:
            self._call("set", self.topics_path, raw)
        except NoNodeError:
            try:
                self._call("create", self.topics_path, raw, makepath=True)
            except NodeExistsError:
                self._call("set", self.topics_path, raw)
        self._published = (topics, perms)

    def read(self, own_state: GroupState | None, own_members: dict[int, MemberRecord]) -> None:
        """Every group of the cluster: state, live members, topics (this broker's own group's
        state and members as the controller read them this pass)."""
        from kazoo.exceptions import NoNodeError

        try:
            names = self._call("get_children", self.cluster_path, watch=self._on_watch)
        except NoNodeError:
            names = []
        view: dict[str, GroupView] = {}
        for name in sorted(names):
            base = f"{self.cluster_path}/{name}"
            if name == self.own_group:
                state, members = own_state, dict(own_members)
            else:
                state, members = self._read_state(base), self._read_members(base)
            topics, perms = self._read_topics(base)
            view[name] = GroupView(name, state, members, topics, perms)
        with self._lock:
            self._view = view

    def _read_state(self, base: str) -> GroupState | None:
        from kazoo.exceptions import NoNodeError

        try:
            raw, _ = self._call("get", f"{base}/state", watch=self._on_watch)
            return GroupState.from_bytes(raw)
        except NoNodeError:
            self._call("exists", f"{base}/state", watch=self._on_watch)
            return None
        except cc.RecordError:
            return None

    def _read_members(self, base: str) -> dict[int, MemberRecord]:
        from kazoo.exceptions import NoNodeError

        try:
            names = self._call("get_children", f"{base}/brokers", watch=self._on_watch)
        except NoNodeError:
            return {}
        out: dict[int, MemberRecord] = {}
        for name in names:
            try:
                raw, _ = self._call("get", f"{base}/brokers/{name}")
                record = MemberRecord.from_bytes(raw)
            except (NoNodeError, cc.RecordError):
                continue
            out[record.member_id] = record
        return out

    def _read_topics(self, base: str) -> tuple[dict[str, int], dict[str, int]]:
        from kazoo.exceptions import NoNodeError

        path = f"{base}/topics"
        try:
            raw, _ = self._call("get", path, watch=self._on_watch)
            return cc.decode_topic_routes(raw)
        except NoNodeError:
            self._call("exists", path, watch=self._on_watch)
            return {}, {}
        except cc.RecordError as e:
            log_event(log, "controller_topics_unreadable", logging.WARNING, path=base,
                      error=str(e))
            return {}, {}
