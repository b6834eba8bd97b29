"""``replog topics``, ``groups``, ``status`` and ``promote``: the operator's views and acts."""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
from typing import Any

from rich.table import Table

from common.cli.output import EXIT_OK, UsageError, curve_args, emit_json, key_value_table, out
from common.client import Admin, Consumer
from common.client.group_progress import POP_FIGURES, describe_groups
from common.core.errors import BrokerError, ResponseCode

PEER_TIMEOUT_MS = 2000  # controller status: a member named by an answer, not by -s, gets this

PROMOTE_TIMEOUT_MS = 30_000


def _attributes(given: list[str] | None) -> dict[str, str] | None:
    """``--attr message.type=FIFO`` (repeatable) -> the attributes; None when none given."""
    if not given:
        return None
    out = {}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--attr {item!r}: give NAME=VALUE, e.g. message.type=FIFO")
        out[name.strip()] = value.strip()
    return out


def cmd_topics(args: argparse.Namespace) -> int:
    """The cluster's topics with their queues and messages, group by group (RocketMQ's
    topicList/topicRoute, ``kafka-topics --describe``); ``--create T --queues N`` makes a topic
    or grows it on every group's master (or on ``--broker-names``)."""
    if (args.create is None) != (args.queues is None):
        raise UsageError("--create TOPIC and --queues N go together")
    if args.attr and args.create is None:
        raise UsageError("--attr goes with --create")
    names = _names(args.broker_names)
    if names is not None and args.create is None:
        raise UsageError("--broker-names goes with --create")
    with Admin(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as admin:
        if args.create is not None:
            attributes = _attributes(args.attr)
            before = admin.create_topic_on_groups(args.create, args.queues, names, attributes)
            doc: dict[str, Any] = {"topic": args.create, "queueNums": args.queues,
                                   "before": min(before.values()), "groups": before}
            if args.json:
                emit_json(doc)
            else:
                for group, was in sorted(before.items()):
                    what = "created" if was == 0 else (
                        "unchanged" if was == args.queues else f"grown from {was}")
                    out.print(f"{args.create} on {group}: {args.queues} queues ({what})")
            return EXIT_OK
        layout = admin.topic_layout()
        table = admin.route_table()
    multi = len(table.groups) > 1
    rows = []
    with Consumer(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as consumer:
        for name in sorted(layout):
            if args.topic and name != args.topic:
                continue
            groups = []
            for group, nums in sorted(layout[name].items()):
                broker = group if multi else None
                ends = [(consumer.min_offset(name, q, broker_name=broker),
                         consumer.max_offset(name, q, broker_name=broker)) for q in range(nums)]
                groups.append({"brokerName": group, "queueNums": nums,
                               "perm": table.perm(name, group),
                               "messages": sum(hi - lo for lo, hi in ends),
                               "maxOffsets": [hi for _, hi in ends]})
            rows.append({"topic": name, "queueNums": sum(g["queueNums"] for g in groups),
                         "messages": sum(g["messages"] for g in groups),
                         "maxOffsets": [o for g in groups for o in g["maxOffsets"]],
                         "perm": min(g["perm"] for g in groups), "groups": groups})
    if args.topic and not rows:
        raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, f"no topic {args.topic}", False)
    if args.json:
        emit_json({"topics": rows})
        return EXIT_OK
    table_out = Table(title="topics" + (f" of cluster {table.cluster}" if multi else ""))
    columns = ("topic", "group", "queues", "perm", "messages", "written per queue")
    for col in columns if multi else (c for c in columns if c != "group"):
        table_out.add_column(col, justify="right" if col in ("queues", "messages") else "left")
    for row in rows:
        for i, g in enumerate(row["groups"]):
            cells = [row["topic"] if i == 0 else "", g["brokerName"], str(g["queueNums"]),
                     _perm(g["perm"]), str(g["messages"]), " ".join(map(str, g["maxOffsets"]))]
            table_out.add_row(*(cells if multi else cells[:1] + cells[2:]))
    out.print(table_out)
    return EXIT_OK


def _names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--broker-names needs at least one group name")
    return names


def _perm(perm: int) -> str:
    """RocketMQ's PermName as text: 6 -> "6 (rw)"."""
    return f"{perm} ({'r' if perm & 4 else '-'}{'w' if perm & 2 else '-'})"


def cmd_producers(args: argparse.Namespace) -> int:
    """A producer group's live producers on every broker group's master (each producer
    heartbeats every master: RocketMQ's ``mqadmin producerConnection``), with
    ``--running-info`` each one's own figures as it answered its master."""
    with Admin(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as admin:
        table = admin.route_table()
        masters = {name: admin.master_address(name if len(table.groups) > 1 else None)
                   for name in table.group_names} or {"": admin.master_address()}
        rows = []
        for broker, address in sorted(masters.items()):
            for producer in admin.producer_connections(args.group, address, args.running_info):
                rows.append({"brokerName": broker, "master": address, **producer})
    if args.json:
        emit_json({"group": args.group, "producers": rows})
        return EXIT_OK
    tbl = Table(title=f"producer group {args.group}")
    columns = ["brokerName", "clientId", "address", "lastHeartbeatAgoMs"]
    if args.running_info:
        columns.append("runningInfo")
    for col in columns:
        tbl.add_column(col)
    for row in rows:
        info = row.get("runningInfo")
        cells = [str(row.get(c, "")) for c in columns[:4]]
        if args.running_info:
            cells.append(", ".join(f"{k}={v}" for k, v in sorted((info or {}).items())))
        tbl.add_row(*cells)
    out.print(tbl)
    if not rows:
        out.print(f"no live producer of group {args.group}")
    return EXIT_OK


def _group_change(args: argparse.Namespace) -> int | None:
    """``--create G [--orderly] [--retry-max N] [--consume-disable]`` or ``--delete G
    [--clean-offset]`` (RocketMQ's updateSubGroup / deleteSubGroup); None when neither."""
    create_only = {"--orderly": args.orderly, "--retry-max": args.retry_max is not None,
                   "--consume-disable": args.consume_disable}
    given = [flag for flag, on in create_only.items() if on]
    if args.create is not None and args.delete is not None:
        raise UsageError("--create and --delete: one at a time")
    if given and args.create is None:
        raise UsageError(f"{', '.join(given)} go(es) with --create")
    if args.clean_offset and args.delete is None:
        raise UsageError("--clean-offset goes with --delete")
    names = _names(args.broker_names)
    if args.create is None and args.delete is None:
        if names is not None:
            raise UsageError("--broker-names goes with --create or --delete")
        return None
    if args.retry_max is not None and not 0 <= args.retry_max <= 10_000:
        raise UsageError(f"--retry-max {args.retry_max}: give 0..10000")
    with Admin(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as admin:
        if args.create is not None:
            created = admin.create_group(
                args.create, orderly=args.orderly, consume_enable=not args.consume_disable,
                retry_max_times=16 if args.retry_max is None else args.retry_max,
                broker_names=names)
            doc: dict[str, Any] = {"group": args.create, "created": created}
            lines = [f"{args.create} on {b}: {'created' if new else 'changed'}"
                     for b, new in sorted(created.items())]
        else:
            deleted = admin.delete_group(args.delete, args.clean_offset, names)
            doc = {"group": args.delete, "deleted": deleted}
            lines = [f"{args.delete} on {b}: "
                     + ("deleted" if d["deleted"] else "had no config")
                     + (f", {d['offsetsRemoved']} offsets removed" if args.clean_offset else "")
                     for b, d in sorted(deleted.items())]
    if args.json:
        emit_json(doc)
    else:
        for line in lines:
            out.print(line)
    return EXIT_OK


def _config_text(config: dict[str, Any] | None) -> str:
    if config is None:
        return ""
    words = ["fifo"] if config["consumeMessageOrderly"] else []
    words.append(f"retry {config['retryMaxTimes']}")
    if not config["consumeEnable"]:
        words.append("disabled")
    return ", ".join(words)


def cmd_groups(args: argparse.Namespace) -> int:
    """Every consumer group the masters know: live members, dead letters and, per topic, the
    committed offsets and the lag (``kafka-consumer-groups --describe``, RocketMQ's
    consumerProgress), POP figures and the group's config, over every broker group of the
    cluster; ``--group G`` shows one. ``--create``/``--delete`` change a group's config."""
    changed = _group_change(args)
    if changed is not None:
        return changed
    with Admin(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as admin, \
            Consumer(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as consumer:
        groups = describe_groups(admin, consumer, args.group)
    if args.json:
        emit_json({"groups": groups})
        return EXIT_OK
    table = Table(title="consumer groups")
    for col in ("group", "config", "members", "topic", "queues", "lag", "deadLetters",
                "POP in flight", "due again", "redelivered", "POP backlog"):
        table.add_column(col, justify="left" if col in ("group", "config", "topic") else "right")
    for g in groups:
        rows = g["topics"] or [{"topic": "", "queues": [], "lag": 0}]
        for i, topic_row in enumerate(rows):
            first = i == 0
            pop = g["pop"]
            table.add_row(g["group"] if first else "",
                          _config_text(g["config"]) if first else "",
                          str(g["members"]) if first else "",
                          topic_row["topic"], str(len(topic_row["queues"])), str(topic_row["lag"]),
                          str(g["deadLetters"]) if first else "",
                          *(str(pop[k]) if first else "" for k in POP_FIGURES))
    out.print(table)
    return EXIT_OK


def cmd_cluster_status(args: argparse.Namespace) -> int:
    """``replog status --cluster``: every broker group of the cluster from any broker's
    CLUSTER_INFO (the controller's view of ZooKeeper), with each master's figures."""
    with Admin(args.servers, timeout_ms=args.timeout_ms, retries=0,
               **curve_args(args)) as admin:
        info = admin.cluster_info(admin.servers[0])
        for group in info["groups"]:
            master = group.get("master") or ""
            try:
                st = admin.status(master) if master else None
            except BrokerError:
                st = None
            group["masterStatus"] = None if st is None else {
                k: st.get(k) for k in ("role", "epoch", "maxPhyOffset", "putTps", "getTps",
                                       "putTotal", "inflight", "fencedWrites")}
    if args.json:
        emit_json(info)
        return EXIT_OK
    table = Table(title=f"cluster {info.get('cluster')}"
                  + ("" if info.get("controller") else " (no controller: this group only)"))
    for col in ("group", "master", "epoch", "SyncStateSet", "slaves", "topics", "max offset",
                "put/s"):
        table.add_column(col)
    for g in sorted(info["groups"], key=lambda g: g["brokerName"]):
        st = g.get("masterStatus") or {}
        table.add_row(g["brokerName"], g.get("master") or "none", str(g.get("masterEpoch", 0)),
                      ",".join(map(str, g.get("syncStateSet") or [])),
                      " ".join(g.get("slaves") or []), str(len(g.get("topics") or {})),
                      str(st.get("maxPhyOffset", "")),
                      f"{st['putTps']:.0f}" if st.get("putTps") is not None else "")
    out.print(table)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    if getattr(args, "cluster", False):
        return cmd_cluster_status(args)
    with Admin(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as admin:
        status = admin.status(admin.servers[0])
    if args.json:
        emit_json(status)
        return EXIT_OK
    keys = (
        "brokerName",
        "brokerId",
        "role",
        "epoch",
        "address",
        "minPhyOffset",
        "maxPhyOffset",
        "flushedPhyOffset",
        "dispatchedPhyOffset",
        "masterAddress",
        "haMasterAddress",
        "putTps",
        "getTps",
        "putLatencyP50Ms",
        "putLatencyP99Ms",
        "flushLagBytes",
        "reputLagBytes",
        "inflight",
    )
    out.print(key_value_table("broker status", [(k, status.get(k, "")) for k in keys]))
    slaves = status.get("slaves") or []
    if slaves:
        table = Table(title="slaves")
        for col in ("address", "ackOffset", "lagBytes", "inSync"):
            table.add_column(col)
        for s in slaves:
            table.add_row(
                *(str(s.get(c, "")) for c in ("address", "ackOffset", "lagBytes", "inSync"))
            )
        out.print(table)
    ctl = status.get("controller") or {}
    if ctl.get("enabled"):
        link = "connected" if ctl.get("connected") else "NOT connected"
        lease = "fresh" if ctl.get("leaseFresh") else "stale"
        rows = [
            ("ZooKeeper", f"{ctl.get('address')} ({link})"),
            ("member", ctl.get("memberId")),
            ("elected master", ctl.get("isMaster")),
            ("lease", f"{lease}, age {ctl.get('leaseAgeMs')} ms of {ctl.get('leaseMs')}"),
            ("group master", f"member {ctl.get('masterId')} at {ctl.get('masterAddress')}"
                             if ctl.get("masterAddress") else
                             f"none: {ctl.get('noMasterReason') or 'not elected yet'}"),
            ("epoch", ctl.get("masterEpoch")),
            ("SyncStateSet", f"{ctl.get('syncStateSet')} (epoch {ctl.get('syncStateSetEpoch')})"),
        ]
        out.print(key_value_table("controller", rows))
    members = status.get("consumerGroups") or {}
    dead = status.get("deadLetters") or {}
    if members or dead:
        table = Table(title="consumer groups")
        for col in ("group", "members", "deadLetters"):
            table.add_column(col)
        for group in sorted({*members, *dead}):
            table.add_row(group, str(members.get(group, 0)), str(dead.get(group, 0)))
        out.print(table)
    health = status.get("health") or {}
    if health:  # the HA service or client: failures and restarts (common/broker/loop.py)
        table = Table(title="components")
        for col in ("component", "state", "failures", "restarts", "lastError"):
            table.add_column(col)
        for name, h in sorted(health.items()):
            table.add_row(name, *(str(h.get(c, "")) for c in
                                  ("state", "failures", "restarts", "lastError")))
        out.print(table)
    return EXIT_OK


def cmd_promote(args: argparse.Namespace) -> int:
    # a switchover (controller mode) waits up to switchoverTimeoutMs (10 s) and the new role
    # to start: the request is given at least PROMOTE_TIMEOUT_MS
    with Admin(args.servers, timeout_ms=max(args.timeout_ms, PROMOTE_TIMEOUT_MS),
               retries=0, **curve_args(args)) as admin:
        status = admin.promote(admin.servers[0], role=args.role)
    if args.json:
        emit_json(status)
    else:
        out.print(
            f"{status.get('address')} is now {status.get('role')} epoch {status.get('epoch')}"
        )
    return EXIT_OK





def _try_status(admin: Admin, address: str,
                timeout_ms: int) -> tuple[str, dict[str, Any] | None]:
    try:
        return address, admin.status(address, timeout_ms)
    except BrokerError:
        return address, None


def controller_groups(statuses: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per broker group from the brokers' status answers: the controller's view
    (RocketMQ's ``getSyncStateSet`` and ``getBrokerEpoch``) as its members see it."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for address, st in statuses.items():
        key = (str(st.get("brokerClusterName", "")), str(st.get("brokerName", "")))
        ctl = st.get("controller") or {}
        row = groups.setdefault(key, {
            "cluster": key[0], "group": key[1], "controller": bool(ctl.get("enabled")),
            "master": "", "masterId": None, "epoch": 0, "syncStateSet": [],
            "syncStateSetEpoch": 0, "noMasterReason": "", "members": {}, "answered": []})
        row["answered"].append(address)
        if ctl.get("enabled"):
            if int(ctl.get("masterEpoch") or 0) >= row["epoch"]:
                row.update(master=ctl.get("masterAddress", ""), masterId=ctl.get("masterId"),
                           epoch=int(ctl.get("masterEpoch") or 0),
                           syncStateSet=list(ctl.get("syncStateSet") or []),
                           syncStateSetEpoch=int(ctl.get("syncStateSetEpoch") or 0),
                           noMasterReason=ctl.get("noMasterReason", ""))
            for mid, rec in (ctl.get("members") or {}).items():
                row["members"][str(mid)] = {
                    "id": int(mid), "address": rec.get("address"), "role": rec.get("role"),
                    "lastEpoch": rec.get("lastEpoch"), "maxOffset": rec.get("maxOffset"),
                    "confirmOffset": rec.get("confirmOffset"),
                    "inSyncStateSet": int(mid) in (ctl.get("syncStateSet") or [])}
        elif st.get("role") in ("SYNC_MASTER", "ASYNC_MASTER") and \
                int(st.get("epoch") or 0) >= row["epoch"]:
            row.update(master=address, epoch=int(st.get("epoch") or 0))
    out = []
    for row in groups.values():
        row["members"] = sorted(row["members"].values(), key=lambda m: m["id"])
        out.append(row)
    return sorted(out, key=lambda r: (r["cluster"], r["group"]))


def cmd_controller(args: argparse.Namespace) -> int:
    """``replog controller status``: one row per broker group, from any of its brokers.

    The brokers given are asked at once; so are the members their answers name (every member
    reports itself), with a short wait: a member's advertised address may not be reachable
    from here (a container's name, seen from the host) and its row comes from the others'
    answers anyway."""
    if args.action == "clear-fault":
        return _clear_fault(args)
    statuses: dict[str, dict[str, Any]] = {}
    with Admin(args.servers, timeout_ms=args.timeout_ms, retries=0, **curve_args(args)) as admin, \
            concurrent.futures.ThreadPoolExecutor(8, "controller-status") as pool:
        asked = list(admin.servers)
        wave, timeout_ms = list(asked), args.timeout_ms
        while wave:
            answers = list(pool.map(functools.partial(_try_status, admin, timeout_ms=timeout_ms),
                                   wave))
            wave, timeout_ms = [], min(args.timeout_ms, PEER_TIMEOUT_MS)
            for address, st in answers:
                if st is None:
                    continue
                statuses[address] = st
                for rec in ((st.get("controller") or {}).get("members") or {}).values():
                    peer = rec.get("address") if isinstance(rec, dict) else None
                    if isinstance(peer, str) and peer and peer not in asked and len(asked) < 256:
                        asked.append(peer)
                        wave.append(peer)
    if not statuses:
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"no broker answered at {args.servers}",
                          True)
    groups = controller_groups(statuses)
    if args.json:
        emit_json({"groups": groups})
        return EXIT_OK
    table = Table(title="broker groups")
    for col in ("group", "master", "epoch", "SyncStateSet", "members (id role maxOffset)"):
        table.add_column(col)
    for g in groups:
        members = "; ".join(f"{m['id']} {m['role']} {m['maxOffset']}"
                            + ("" if m["inSyncStateSet"] else " (out)")
                            for m in g["members"])
        master = g["master"] or f"none: {g['noMasterReason'] or 'not elected'}"
        table.add_row(f"{g['cluster']}/{g['group']}", master, str(g["epoch"]),
                      ",".join(map(str, g["syncStateSet"])), members)
    out.print(table)
    return EXIT_OK


def _clear_fault(args: argparse.Namespace) -> int:
    """``replog controller clear-fault -s ADDR``: one broker, named alone."""
    if len(args.servers) != 1:
        raise UsageError("controller clear-fault: name exactly one broker with -s")
    address = args.servers[0]
    with Admin([address], timeout_ms=args.timeout_ms, retries=0, **curve_args(args)) as admin:
        had = admin.clear_election_fault(address)
    if args.json:
        emit_json({"address": address, "cleared": had})
    else:
        out.print(f"{address}: " + (f"cleared the fault ({had}); it stands in elections again"
                                if had else "had no fault"))
    return EXIT_OK
