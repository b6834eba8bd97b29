"""The ``replog`` command (CONTRACT section 3) and the composition root of a broker process.

    replog broker -c FILE [--set k=v]...
    replog cluster up [--dir D] [--slaves N] [--mode sync|async] [--base-port P] [--duration S]
    replog send -t TOPIC (-b BODY | --file F | --count N --size BYTES) [--tags T] [--keys K]
                [--queue Q] [--delay-level L]
    replog pull -t TOPIC [-q QUEUE] [-o OFFSET] [-n MAX] [--group G]
    replog query (--topic T --key K | --msg-id ID | --offset PHYOFFSET)
    replog offsets -t TOPIC [-q QUEUE] [--time T] [--group G [--reset]]   (an extension)
    replog consume -t TOPIC[,TOPIC] --group G [--from latest|earliest] [-n MAX]
                   [--broadcasting [--offsets-file F]]   (an extension)
    replog topics [-t TOPIC] [--create TOPIC --queues N]   (an extension)
    replog groups [--group G]   (an extension)
    replog status
    replog promote

Client commands take ``-s/--servers host:port[,...]`` and ``--json`` (one JSON document on
stdout). Exit status: 0 success, 1 refused or failed (the outcome is still printed), 2 bad usage.

This module is the one place that knows every role class: ``make_role`` builds ``master/role.py``
or ``slave/role.py`` objects for ``common.broker.Broker``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from common.client import Admin, Consumer, Producer, SendResult, parse_servers
from common.config import KNOWN_KEYS, dump_yaml, load_config
from common.errors import BrokerError, ConfigError, ResponseCode, SendStatus, StoreError
from common.message import DEFAULT_COMPRESS_OVER_BYTES

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_SERVERS = "127.0.0.1:10911"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
CLUSTER_SEGMENT_BYTES = 128 * 1024 * 1024
GIL_SWITCH_INTERVAL_S = 0.0005

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class UsageError(Exception):
    """Bad command-line usage (exit status 2)."""


# ---- composition root ---------------------------------------------------------------------------


def make_role(role_name: str, broker: Any) -> Any:
    """Build the role object for ``role_name`` (the broker hands itself in)."""
    if role_name == "SLAVE":
        from slave.config_sync import ConfigSync
        from slave.ha_client import build_slave_replication
        from slave.role import SlaveRole

        ha_client = build_slave_replication(broker.cfg, broker.store)
        sync = ConfigSync(broker.cfg.slaveConfigSyncIntervalMs, ha_client.master_address,
                          broker.apply_master_document)
        return SlaveRole(broker.cfg, ha_client=ha_client, config_sync=sync)
    from master.ha_service import build_master_replication
    from master.role import MasterRole

    # the request server's I/O thread drives the HA socket itself (no thread hand-off per put)
    service, waiter = build_master_replication(
        broker.cfg, broker.store, role_name, host=broker.server
    )
    return MasterRole(broker.cfg, broker.store, broker.topics, role_name, waiter, service)


def run_broker(config_path: str, overrides: Sequence[str]) -> int:
    from common.broker import Broker
    from common.store.message_store import MessageStore

    cfg = load_config(config_path, overrides)
    # The I/O thread gives up the GIL on every socket call; with the default 5 ms switch
    # interval a busy store thread (reput, flush) can hold it that long each time (convoy).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        broker = Broker(cfg, MessageStore(cfg), make_role)
        broker.serve_forever()
    except (StoreError, ValueError, OSError) as e:
        logging.getLogger("replog.broker").error("event=broker_start_failed error=%r", str(e))
        err.print(f"replog broker: cannot start: {e}", soft_wrap=True)
        return EXIT_FAILED
    return EXIT_OK


# ---- output helpers ---------------------------------------------------------------------------


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, default=str) + "\n")
    sys.stdout.flush()


def error_doc(e: BrokerError) -> dict[str, Any]:
    return {"error": e.code.name, "remark": e.remark, "retriable": e.retriable}


def _table(title: str, rows: Sequence[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for name, value in rows:
        table.add_row(name, str(value))
    return table


# ---- client commands --------------------------------------------------------------------------


def cmd_send(args: argparse.Namespace) -> int:
    sources = [args.body is not None, args.file is not None, args.count is not None]
    if sum(sources) != 1:
        raise UsageError("give exactly one of -b BODY, --file F or --count N --size BYTES")
    if args.count is not None and (args.size is None or args.count < 1 or args.size < 0):
        raise UsageError("--count N needs --size BYTES (N >= 1, BYTES >= 0)")
    if args.shard_key is not None and args.queue is not None:
        raise UsageError("give --queue or --shard-key, not both")
    if args.compress_over < 0:
        raise UsageError("--compress-over BYTES must be >= 0 (0: never compress)")
    with Producer(args.servers, timeout_ms=args.timeout_ms,
                  compress_over_bytes=args.compress_over or None) as producer:
        if args.count is None:
            body = (
                args.body.encode("utf-8") if args.body is not None else Path(args.file).read_bytes()
            )
            result = producer.send(
                args.topic,
                body,
                args.tags,
                args.keys,
                queue_id=args.queue,
                delay_level=args.delay_level,
                shard_key=args.shard_key,
            )
            return _print_sends(args, [result], single=True)
        results = _send_many(producer, args)
    return _print_sends(args, results, single=False)


def _send_many(producer: Producer, args: argparse.Namespace) -> list[SendResult]:
    """``--count N --size BYTES``: pipelined sends with a progress bar (human mode)."""
    from rich.progress import Progress

    futures = []
    body_for = _body_maker(args.size)
    with Progress(console=err, disable=args.json or args.count < 100, transient=True) as progress:
        task = progress.add_task(f"sending {args.count} messages", total=args.count)
        if args.delay_level:  # send_async coalesces into batches, which cannot be delayed
            results = []
            for i in range(args.count):
                results.append(producer.send(args.topic, body_for(i), args.tags, args.keys,
                                             queue_id=args.queue, delay_level=args.delay_level,
                                             shard_key=args.shard_key))
                progress.advance(task)
            return results
        for i in range(args.count):
            futures.append(
                producer.send_async(
                    args.topic, body_for(i), args.tags, args.keys, queue_id=args.queue,
                    shard_key=args.shard_key,
                )
            )
            futures[-1].add_done_callback(lambda _f: progress.advance(task))
        results = [f.result() for f in futures]
    return results


def _body_maker(size: int) -> Callable[[int], bytes]:
    def body(i: int) -> bytes:
        prefix = f"msg-{i}-".encode()
        return (prefix * (size // max(1, len(prefix)) + 1))[:size]

    return body


def _print_sends(args: argparse.Namespace, results: list[SendResult], single: bool) -> int:
    ok = all(r.status == SendStatus.SEND_OK for r in results)
    if args.json:
        emit_json(results[0].to_json() if single else [r.to_json() for r in results])
    elif single:
        r = results[0]
        out.print(
            _table(
                "send",
                [
                    ("status", r.status.value),
                    ("msgId", r.msg_id),
                    ("queueId", r.queue_id),
                    ("queueOffset", r.queue_offset),
                    ("commitLogOffset", r.commit_log_offset),
                ],
            )
        )
    else:
        counts: dict[str, int] = {}
        for r in results:
            counts[r.status.value] = counts.get(r.status.value, 0) + 1
        out.print(_table(f"sent {len(results)} messages", sorted(counts.items())))
    return EXIT_OK if ok else EXIT_FAILED


def cmd_pull(args: argparse.Namespace) -> int:
    with Consumer(args.servers, group=args.group, timeout_ms=args.timeout_ms) as consumer:
        offset = args.offset
        if offset is None:
            committed = consumer.fetch_offset(args.topic, args.queue)
            offset = max(0, committed)
        result = consumer.pull(args.topic, args.queue, offset, args.max, suspend_ms=args.suspend_ms)
    if args.json:
        emit_json(result.to_json())
    else:
        out.print(
            f"status={result.status.value} nextBeginOffset={result.next_begin_offset} "
            f"minOffset={result.min_offset} maxOffset={result.max_offset}"
        )
        _print_messages(result.messages)
    return EXIT_OK


def _print_messages(messages: Sequence[Any]) -> None:
    table = Table(title=f"{len(messages)} messages")
    for col in ("queueOffset", "commitLogOffset", "msgId", "tags", "keys", "body"):
        table.add_column(col)
    for m in messages:
        doc = m.to_json()
        body = doc["body"] if doc["body"] is not None else f"<{len(m.body)} bytes>"
        table.add_row(
            str(m.queue_offset),
            str(m.commit_log_offset),
            m.msg_id,
            str(m.tags or ""),
            str(m.keys or ""),
            body[:60],
        )
    out.print(table)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def parse_time_ms(text: str) -> int:
    """``--time``: ms since the epoch, or an ISO 8601 date-time (local time unless it names a
    zone, as RocketMQ's and Kafka's offset-reset tools read it)."""
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--time {text!r}: give ms since the epoch or an ISO 8601 date-time "
            "(2026-11-22T10:00:00, 2026-11-22T10:00:00+00:00)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # a naive date-time is local time
    # in integers: a float timestamp * 1000 can land 1 ms early (.678 -> 677.9999)
    return (when - _EPOCH) // datetime.timedelta(milliseconds=1)


def cmd_offsets(args: argparse.Namespace) -> int:
    if args.reset and (args.time is None or args.group is None):
        raise UsageError("--reset needs --group G and --time T")
    timestamp = parse_time_ms(args.time) if args.time is not None else None
    with Consumer(args.servers, group=args.group or "replog-cli",
                  timeout_ms=args.timeout_ms) as consumer:
        queues = [args.queue] if args.queue is not None else range(consumer.queue_nums(args.topic))
        rows = []
        for q in queues:
            row: dict[str, Any] = {
                "queueId": q,
                "minOffset": consumer.min_offset(args.topic, q),
                "maxOffset": consumer.max_offset(args.topic, q),
            }
            if timestamp is not None:
                row["offsetAtTime"] = consumer.search_offset(args.topic, q, timestamp)
            if args.group is not None:
                committed = consumer.fetch_offset(args.topic, q)
                if args.reset:
                    consumer.commit_offset(args.topic, q, row["offsetAtTime"])
                    row["previousOffset"], committed = committed, row["offsetAtTime"]
                row["committedOffset"] = committed
                row["lag"] = row["maxOffset"] - max(committed, row["minOffset"])
            rows.append(row)
    doc = {"topic": args.topic, "timestamp": timestamp, "group": args.group,
           "reset": bool(args.reset), "queues": rows}
    if args.json:
        emit_json(doc)
        return EXIT_OK
    title = f"{args.topic}" + (f" (group {args.group})" if args.group else "")
    if args.reset:
        title += f": offsets reset to {args.time}"
    table = Table(title=title)
    cols = list(rows[0]) if rows else ["queueId", "minOffset", "maxOffset"]
    for col in cols:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*(str(row[c]) for c in cols))
    out.print(table)
    return EXIT_OK


def cmd_topics(args: argparse.Namespace) -> int:
    """The group's topics with their queues and messages (RocketMQ's topicList/topicStatus,
    ``kafka-topics --describe``); ``--create T --queues N`` makes a topic or grows it."""
    if (args.create is None) != (args.queues is None):
        raise UsageError("--create TOPIC and --queues N go together")
    with Admin(args.servers, timeout_ms=args.timeout_ms) as admin:
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
    with Consumer(args.servers, timeout_ms=args.timeout_ms) as consumer:
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
    with Admin(args.servers, timeout_ms=args.timeout_ms) as admin:
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
    with Consumer(args.servers, timeout_ms=args.timeout_ms) as consumer:
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


def cmd_consume(args: argparse.Namespace) -> int:
    """A group member until ``--max`` messages or ``--idle-s`` without one (or Ctrl-C)."""
    from common.group_consumer import GroupConsumer

    topics = [t.strip() for t in args.topic.split(",") if t.strip()]
    count = 0
    consumed: list[dict[str, Any]] = []  # --json: one document at the end, as every command
    if args.offsets_file is not None and not args.broadcasting:
        raise UsageError("--offsets-file goes with --broadcasting")
    model = "broadcasting" if args.broadcasting else "clustering"
    with GroupConsumer(args.servers, args.group, topics, start=args.start,
                       timeout_ms=args.timeout_ms, model=model,
                       offsets_path=args.offsets_file) as consumer:
        idle_until = time.monotonic() + args.idle_s
        try:
            while (args.max <= 0 or count < args.max) and time.monotonic() < idle_until:
                messages = consumer.poll(timeout_ms=500)
                if messages:
                    idle_until = time.monotonic() + args.idle_s
                for m in messages[: args.max - count if args.max > 0 else None]:
                    count += 1
                    if args.json:
                        consumed.append(m.to_json())
                    else:
                        body = m.to_json()["body"]
                        out.print(f"{m.topic}/{m.queue_id}@{m.queue_offset} "
                                  f"{body if body is not None else f'<{len(m.body)} bytes>'}")
        except KeyboardInterrupt:
            pass
    if args.json:
        emit_json({"group": args.group, "topics": topics, "consumed": count,
                   "messages": consumed})
    else:
        err.print(f"consumed {count} messages as a member of {args.group}")
    return EXIT_OK


def cmd_dlq(args: argparse.Namespace) -> int:
    """A group's dead letters from its position in its DLQ; ``--resend`` re-drives them."""
    from common import dead_letters

    if args.max <= 0:
        raise UsageError("-n must be at least 1")
    with Consumer(args.servers, group=args.group, timeout_ms=args.timeout_ms) as consumer:
        letters = dead_letters.read(consumer, args.max)
        resent = 0
        if args.resend and letters.messages:
            with Producer(args.servers, timeout_ms=args.timeout_ms) as producer:
                resent = len(dead_letters.redrive(producer, consumer, letters))
    rows = [{**m.to_json(), "originTopic": m.properties.get("RETRY_TOPIC", m.topic),
             "reconsumeTimes": m.reconsume_times} for m in letters.messages]
    if args.json:
        emit_json({"group": args.group, "fromOffset": letters.start, "maxOffset": letters.end,
                   "resent": resent, "messages": rows})
        return EXIT_OK
    table = Table(title=f"dead letters of {args.group} (offset {letters.start} of "
                        f"{letters.end})")
    for col in ("queueOffset", "originTopic", "msgId", "reconsumeTimes", "body"):
        table.add_column(col)
    for row in rows:
        body = row["body"] if row["body"] is not None else f"<{len(row['bodyBase64'])} b64>"
        table.add_row(str(row["queueOffset"]), row["originTopic"], row["msgId"],
                      str(row["reconsumeTimes"]), body[:60])
    out.print(table)
    if args.resend:
        err.print(f"resent {resent} to %RETRY%{args.group}")
    return EXIT_OK


def cmd_query(args: argparse.Namespace) -> int:
    modes = [args.key is not None, args.msg_id is not None, args.offset is not None]
    if sum(modes) != 1 or (args.key is not None and not args.topic):
        raise UsageError("give exactly one of --topic T --key K, --msg-id ID or --offset PHYOFFSET")
    with Admin(args.servers, timeout_ms=args.timeout_ms) as admin:
        if args.key is not None:
            found = admin.query_by_key(args.topic, args.key, args.max)
        else:
            one = (
                admin.query_by_msg_id(args.msg_id)
                if args.msg_id is not None
                else admin.query_by_offset(args.offset)
            )
            found = [one] if one is not None else []
    if args.json:
        emit_json({"found": len(found), "messages": [m.to_json() for m in found]})
    else:
        _print_messages(found)
    return EXIT_OK if found else EXIT_FAILED


def cmd_status(args: argparse.Namespace) -> int:
    with Admin(args.servers, timeout_ms=args.timeout_ms) as admin:
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
    out.print(_table("broker status", [(k, status.get(k, "")) for k in keys]))
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
    with Admin(args.servers, timeout_ms=args.timeout_ms) as admin:
        status = admin.promote(admin.servers[0], role=args.role)
    if args.json:
        emit_json(status)
    else:
        out.print(
            f"{status.get('address')} is now {status.get('role')} epoch {status.get('epoch')}"
        )
    return EXIT_OK


# ---- cluster up -------------------------------------------------------------------------------


@dataclasses.dataclass
class ChildBroker:
    name: str
    role: str
    address: str
    config_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "address": self.address,
            "pid": self.process.pid if self.process else None,
            "config": str(self.config_path),
            "log": str(self.log_path),
        }


class LocalCluster:
    """1 master + N slaves as child ``replog broker`` processes under one directory."""

    def __init__(
        self, directory: Path, slaves: int = 2, mode: str = "sync", base_port: int = 10911
    ):
        self.directory = directory.resolve()
        self.base_port = base_port
        self.size = slaves + 1
        self.children = [self._child(i, mode) for i in range(slaves + 1)]

    def _child(self, index: int, mode: str) -> ChildBroker:
        port = self.base_port + 10 * index
        master_role = "SYNC_MASTER" if mode == "sync" else "ASYNC_MASTER"
        role = master_role if index == 0 else "SLAVE"
        home = self.directory / f"broker-{index}"
        cfg = load_config(
            None,
            (),
            env={},
            brokerName="broker-a",
            brokerId=index,
            brokerRole=role,
            listenPort=port,
            haListenPort=port + 1,
            haMasterAddress="" if index == 0 else f"127.0.0.1:{self.base_port + 1}",
            # the master, restarted after a slave was promoted, rejoins as a slave; a promoted
            # slave, restarted, checks that no newer master exists before it resumes
            groupServers=",".join(f"127.0.0.1:{self.base_port + 10 * i}"
                                  for i in range(self.size) if i != index),
            storePathRootDir=str(home / "store"),
            metricsPort=port + 2,
            mappedFileSizeCommitLog=CLUSTER_SEGMENT_BYTES,
        )
        child = ChildBroker(
            f"broker-{index}", role, f"127.0.0.1:{port}", home / "broker.yaml", home / "broker.log"
        )
        child.config_path.parent.mkdir(parents=True, exist_ok=True)
        child.config_path.write_text(dump_yaml(cfg))
        return child

    def start(self) -> None:
        for child in self.children:
            child.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(child.log_path, "ab") as log_file:
                child.process = subprocess.Popen(
                    [sys.executable, "-m", "common.cli", "broker", "-c", str(child.config_path)],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=broker_env(),
                )
        self.wait_ready(READY_TIMEOUT_S)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with Admin([c.address for c in self.children], timeout_ms=1000, retries=0) as admin:
            for child in self.children:
                while True:
                    if child.process is not None and child.process.poll() is not None:
                        raise RuntimeError(
                            f"{child.name} exited with {child.process.returncode}; "
                            f"see {child.log_path}"
                        )
                    try:
                        admin.status(child.address)
                        break
                    except BrokerError:
                        if time.monotonic() > deadline:
                            raise RuntimeError(
                                f"{child.name} not answering at {child.address}"
                            ) from None

    def status_line(self, admin: Admin) -> str:
        parts = []
        for child in self.children:
            try:
                s = admin.status(child.address)
                parts.append(
                    f"{child.name} {s['role']} max={s['maxPhyOffset']} "
                    f"put/s={s.get('putTps', 0):.0f}"
                )
            except BrokerError:
                parts.append(f"{child.name} DOWN")
        return " | ".join(parts)

    def stop(self) -> None:
        """SIGTERM every child, wait (bounded), SIGKILL what is left."""
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in self.children:
            if child.process is None:
                continue
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait(5)


def broker_env() -> dict[str, str]:
    """This environment minus ``REPLOG_*`` variables that are not config keys (REPLOG_DEMO_...),
    which a broker would refuse as unknown keys."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("REPLOG_") or k[len("REPLOG_") :] in KNOWN_KEYS
    }


@contextlib.contextmanager
def running_cluster(cluster: LocalCluster) -> Iterator[LocalCluster]:
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def cmd_cluster(args: argparse.Namespace) -> int:
    if args.action != "up":
        raise UsageError("usage: replog cluster up [...]")
    if args.slaves < 0 or not 1 <= args.base_port <= 65535 - 10 * args.slaves - 2:
        raise UsageError("--slaves must be >= 0 and ports must fit below 65536")
    cluster = LocalCluster(Path(args.dir), args.slaves, args.mode, args.base_port)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with running_cluster(cluster):
            _announce(args, cluster)
            _watch(args, cluster, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not args.json:
        out.print("cluster stopped")
    return EXIT_OK


def _announce(args: argparse.Namespace, cluster: LocalCluster) -> None:
    if args.json:
        emit_json(
            {"dir": str(cluster.directory), "brokers": [c.to_json() for c in cluster.children]}
        )
        return
    table = Table(title=f"replog cluster under {cluster.directory}")
    for col in ("name", "role", "client address", "HA port", "pid", "log"):
        table.add_column(col)
    for c in cluster.children:
        port = int(c.address.rsplit(":", 1)[1])
        table.add_row(
            c.name,
            c.role,
            c.address,
            str(port + 1),
            str(c.process.pid if c.process else ""),
            str(c.log_path),
        )
    out.print(table)
    out.print(f"try: replog status -s {cluster.children[0].address}   (Ctrl-C stops the cluster)")


def _watch(args: argparse.Namespace, cluster: LocalCluster, stop: threading.Event) -> None:
    deadline = time.monotonic() + args.duration if args.duration else float("inf")
    with Admin([c.address for c in cluster.children], timeout_ms=1000, retries=0) as admin:
        while not stop.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                break
            if not args.json:
                err.print(cluster.status_line(admin), end="\r", soft_wrap=True)
    if not args.json:
        err.print()


# ---- argument parsing ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replog", description="replicated commit-log broker")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("broker", help="run one broker")
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")

    p = sub.add_parser("pipeline", help="run a Spark job: audit, stats or reindex",
                       add_help=False)
    p.add_argument("job_args", nargs=argparse.REMAINDER)

    p = sub.add_parser("cluster", help="run a local broker group")
    p.add_argument("action", choices=["up"])
    p.add_argument("--dir", default="run/cluster")
    p.add_argument("--slaves", type=int, default=2)
    p.add_argument("--mode", choices=["sync", "async"], default="sync")
    p.add_argument("--base-port", type=int, default=10911)
    p.add_argument("--duration", type=float, default=0.0, help="seconds; 0 runs until Ctrl-C")
    p.add_argument("--json", action="store_true")

    p = _client(sub, "send", "produce messages")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-b", "--body")
    p.add_argument("--file")
    p.add_argument("--count", type=int)
    p.add_argument("--size", type=int)
    p.add_argument("--tags")
    p.add_argument("--keys")
    p.add_argument("--queue", type=int)
    p.add_argument("--shard-key", help="every message of a key to one queue, in order")
    p.add_argument("--delay-level", type=int, default=0)
    p.add_argument("--compress-over", type=int, default=DEFAULT_COMPRESS_OVER_BYTES,
                   metavar="BYTES",
                   help="deflate bodies of at least BYTES (default %(default)s, 0: never)")

    p = _client(sub, "pull", "read from a consume queue")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-q", "--queue", type=int, default=0)
    p.add_argument("-o", "--offset", type=int)
    p.add_argument("-n", "--max", type=int, default=32)
    p.add_argument("--group", default="replog-cli")
    p.add_argument("--suspend-ms", type=int, default=0)

    p = _client(sub, "consume", "read topics as a member of a consumer group")
    p.add_argument("-t", "--topic", required=True, help="a topic or t1,t2")
    p.add_argument("--group", required=True)
    p.add_argument("--from", dest="start", choices=["latest", "earliest"], default="latest",
                   help="where a queue the group never committed starts")
    p.add_argument("-n", "--max", type=int, default=0, help="stop after N messages (0: no limit)")
    p.add_argument("--idle-s", type=float, default=10.0, help="stop after S seconds without one")
    p.add_argument("--broadcasting", action="store_true",
                   help="read every queue (every message), offsets kept in a local file")
    p.add_argument("--offsets-file", help="with --broadcasting: where the offsets are kept "
                   "(default ~/.replog_offsets/<host>@DEFAULT/<group>/offsets.json)")

    p = _client(sub, "dlq", "a consumer group's dead letters; --resend sends them to it again")
    p.add_argument("--group", required=True)
    p.add_argument("-n", "--max", type=int, default=32)
    p.add_argument("--resend", action="store_true",
                   help="send them to the group's retry topic and move past them")

    p = _client(sub, "query", "look a message up")
    p.add_argument("--topic")
    p.add_argument("--key")
    p.add_argument("--msg-id")
    p.add_argument("--offset", type=int)
    p.add_argument("-n", "--max", type=int, default=32)

    p = _client(sub, "offsets", "a topic's queue offsets; the offset at a time; a group's lag")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-q", "--queue", type=int, help="one queue (default: every queue)")
    p.add_argument("--time", help="ms since the epoch or ISO 8601: the first offset stored then")
    p.add_argument("--group", help="show the group's committed offsets and lag")
    p.add_argument("--reset", action="store_true",
                   help="commit the offsets at --time for --group (replay or skip from then)")

    p = _client(sub, "topics", "the group's topics, queues and messages; make or grow a topic")
    p.add_argument("-t", "--topic", help="only this topic")
    p.add_argument("--create", metavar="TOPIC", help="make TOPIC, or give it more queues")
    p.add_argument("--queues", type=int, help="with --create: the queue count (never fewer)")

    p = _client(sub, "groups", "consumer groups: members, lag per topic, dead letters")
    p.add_argument("--group", help="only this group")

    _client(sub, "status", "one broker's state")
    p = _client(sub, "promote", "turn the slave at -s into the master")
    p.add_argument("--role", choices=["SYNC_MASTER", "ASYNC_MASTER"], default="SYNC_MASTER")
    return parser


def _client(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
    p.add_argument("-s", "--servers", default=DEFAULT_SERVERS, type=_servers_arg)
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout-ms", type=int, default=10_000)
    return p


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "send": cmd_send,
    "pull": cmd_pull,
    "query": cmd_query,
    "offsets": cmd_offsets,
    "topics": cmd_topics,
    "groups": cmd_groups,
    "consume": cmd_consume,
    "dlq": cmd_dlq,
    "status": cmd_status,
    "promote": cmd_promote,
    "cluster": cmd_cluster,
}


def _servers_arg(text: str) -> str:
    """``-s`` checked while parsing, so a malformed one is bad usage (exit 2), not a failure."""
    try:
        parse_servers(text)
    except BrokerError as e:
        raise argparse.ArgumentTypeError(e.remark) from None
    return text


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pipeline"]:  # the Spark jobs parse their own arguments
        from common.pipeline.jobs import main as pipeline_main

        return pipeline_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "broker":
            return run_broker(args.config, args.set)

        return COMMANDS[args.command](args)
    except UsageError as e:
        parser.error(str(e))  # exits 2
    except ConfigError as e:
        err.print(f"replog: {e}")
        return EXIT_USAGE
    except BrokerError as e:
        if getattr(args, "json", False):
            emit_json(error_doc(e))
        else:
            err.print(f"replog: {e.code.name}: {e.remark}")
        return EXIT_FAILED
    except OSError as e:
        err.print(f"replog: {e}")
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
