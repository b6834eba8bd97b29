"""``replog topics``, ``groups``, ``status`` and ``promote``: the operator's views and acts."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from common.cli.output import EXIT_OK, UsageError, curve_args, emit_json, key_value_table, out
from common.client import Admin, Consumer
from common.core.errors import BrokerError, ResponseCode


def cmd_topics(args: argparse.Namespace) -> int:
    """The group's topics with their queues and messages (RocketMQ's topicList/topicStatus,
    ``kafka-topics --describe``); ``--create T --queues N`` makes a topic or grows it."""
    if (args.create is None) != (args.queues is None):
        raise UsageError("--create TOPIC and --queues N go together")
    with Admin(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as admin:
        if args.create is not None:
            before = admin.create_topic(args.create, args.queues)
            doc: dict[str, Any] = {"topic": args.create, "queueNums": args.queues,
                                   "before": before}
            if args.json:
                emit_json(doc)
            else:
                what = "created" if before == 0 else (
                    "unchanged" if before == args.queues else f"grown from {before}")
                out.print(f"{args.create}: {args.queues} queues ({what})")
            return EXIT_OK
        topics = admin.topics()
    rows = []
    with Consumer(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as consumer:
        for name in sorted(topics):
            if args.topic and name != args.topic:
                continue
            ends = [(consumer.min_offset(name, q), consumer.max_offset(name, q))
                    for q in range(topics[name])]
            rows.append({"topic": name, "queueNums": topics[name],
                         "messages": sum(hi - lo for lo, hi in ends),
                         "maxOffsets": [hi for _, hi in ends]})
    if args.topic and not rows:
        raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, f"no topic {args.topic}", False)
    if args.json:
        emit_json({"topics": rows})
        return EXIT_OK
    table = Table(title="topics")
    table.add_column("topic")
    table.add_column("queues", justify="right")
    table.add_column("messages", justify="right")
    table.add_column("written per queue")
    for row in rows:
        table.add_row(row["topic"], str(row["queueNums"]), str(row["messages"]),
                      " ".join(map(str, row["maxOffsets"])))
    out.print(table)
    return EXIT_OK


def cmd_groups(args: argparse.Namespace) -> int:
    """Every consumer group on the master: live members, dead letters and, per topic, the
    committed offsets and the lag (``kafka-consumer-groups --describe``, RocketMQ's
    consumerProgress); ``--group G`` shows one."""
    with Admin(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as admin:
        offsets = admin.group_offsets()
        status = admin.status(admin.master_address())
    members: dict[str, int] = status.get("consumerGroups") or {}
    dead: dict[str, int] = status.get("deadLetters") or {}
    names = sorted({*offsets, *members, *dead})
    if args.group is not None:
        if args.group not in names:
            raise BrokerError(ResponseCode.QUERY_NOT_FOUND,
                              f"no consumer group {args.group} on the master", False)
        names = [args.group]
    groups = []
    with Consumer(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as consumer:
        for name in names:
            topics = []
            for topic, committed in sorted(offsets.get(name, {}).items()):
                queues = []
                for q, offset in sorted(committed.items()):
                    low, high = consumer.min_offset(topic, q), consumer.max_offset(topic, q)
                    queues.append({"queueId": q, "committedOffset": offset, "maxOffset": high,
                                   "lag": max(0, high - max(offset, low))})
                topics.append({"topic": topic, "lag": sum(r["lag"] for r in queues),
                               "queues": queues})
            groups.append({"group": name, "members": members.get(name, 0),
                           "deadLetters": dead.get(name, 0),
                           "lag": sum(t["lag"] for t in topics), "topics": topics})
    if args.json:
        emit_json({"groups": groups})
        return EXIT_OK
    table = Table(title="consumer groups")
    for col in ("group", "members", "topic", "queues", "lag", "deadLetters"):
        table.add_column(col, justify="left" if col in ("group", "topic") else "right")
    for g in groups:
        rows = g["topics"] or [{"topic": "", "queues": [], "lag": 0}]
        for i, topic_row in enumerate(rows):
            first = i == 0
            table.add_row(g["group"] if first else "", str(g["members"]) if first else "",
                          topic_row["topic"], str(len(topic_row["queues"])), str(topic_row["lag"]),
                          str(g["deadLetters"]) if first else "")
    out.print(table)
    return EXIT_OK



def cmd_status(args: argparse.Namespace) -> int:
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
    members = status.get("consumerGroups") or {}
    dead = status.get("deadLetters") or {}
    if members or dead:
        table = Table(title="consumer groups")
        for col in ("group", "members", "deadLetters"):
            table.add_column(col)
        for group in sorted({*members, *dead}):
            table.add_row(group, str(members.get(group, 0)), str(dead.get(group, 0)))
        out.print(table)
    return EXIT_OK


def cmd_promote(args: argparse.Namespace) -> int:
    with Admin(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as admin:
        status = admin.promote(admin.servers[0], role=args.role)
    if args.json:
        emit_json(status)
    else:
        out.print(
            f"{status.get('address')} is now {status.get('role')} epoch {status.get('epoch')}"
        )
    return EXIT_OK



