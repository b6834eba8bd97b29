"""``replog offsets``, ``consume`` and ``dlq``: where consumers stand, a group member, dead
letters."""

from __future__ import annotations

import argparse
import datetime
import time
from typing import Any

from rich.table import Table

from common.cli.output import EXIT_OK, UsageError, curve_args, emit_json, err, out
from common.client import Consumer, Producer
from common.client.group_progress import topic_queues

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
                  timeout_ms=args.timeout_ms, **curve_args(args)) as consumer:
        multi, queues = topic_queues(consumer, args.topic, args.broker_name, args.queue)
        rows = []
        for name, q in queues:
            row: dict[str, Any] = {"brokerName": name} if multi else {}
            row.update({
                "queueId": q,
                "minOffset": consumer.min_offset(args.topic, q, broker_name=name),
                "maxOffset": consumer.max_offset(args.topic, q, broker_name=name),
            })
            if timestamp is not None:
                row["offsetAtTime"] = consumer.search_offset(args.topic, q, timestamp,
                                                             broker_name=name)
            if args.group is not None:
                committed = consumer.fetch_offset(args.topic, q, broker_name=name)
                if args.reset:
                    consumer.commit_offset(args.topic, q, row["offsetAtTime"],
                                           broker_name=name)
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



def consumer_multi(consumer: Any) -> bool:
    """The group consumer reads several broker groups (its queues name their group)."""
    return any(len(q) > 2 for q in consumer.assignment())


def cmd_consume(args: argparse.Namespace) -> int:
    """A group member until ``--max`` messages or ``--idle-s`` without one (or Ctrl-C)."""
    from common.client.group_consumer import GroupConsumer

    if args.pop:
        return _consume_by_pop(args)
    if args.fifo or args.no_ack:
        raise UsageError("--fifo and --no-ack go with --pop")

    topics = [t.strip() for t in args.topic.split(",") if t.strip()]
    count = 0
    consumed: list[dict[str, Any]] = []  # --json: one document at the end, as every command
    if args.offsets_file is not None and not args.broadcasting:
        raise UsageError("--offsets-file goes with --broadcasting")
    model = "broadcasting" if args.broadcasting else "clustering"
    with GroupConsumer(args.servers, args.group, topics, start=args.start,
                       timeout_ms=args.timeout_ms, **curve_args(args), model=model,
                       offsets_path=args.offsets_file) as consumer:
        idle_until = time.monotonic() + args.idle_s
        try:
            batch = consumer.max_messages
            while (args.max <= 0 or count < args.max) and time.monotonic() < idle_until:
                if args.max > 0:  # never poll past -n: what poll returns is committed
                    consumer.max_messages = max(1, min(batch, args.max - count))
                messages = consumer.poll(timeout_ms=500)
                if messages:
                    idle_until = time.monotonic() + args.idle_s
                for m in messages[: args.max - count if args.max > 0 else None]:
                    count += 1
                    if args.json:
                        consumed.append(m.to_json())
                    else:
                        body = m.to_json()["body"]
                        group = f"{m.broker_name}:" if consumer_multi(consumer) else ""
                        out.print(f"{group}{m.topic}/{m.queue_id}@{m.queue_offset} "
                                  f"{body if body is not None else f'<{len(m.body)} bytes>'}")
        except KeyboardInterrupt:
            pass
    if args.json:
        emit_json({"group": args.group, "topics": topics, "consumed": count,
                   "messages": consumed})
    else:
        err.print(f"consumed {count} messages as a member of {args.group}")
    return EXIT_OK


def _consume_by_pop(args: argparse.Namespace) -> int:
    """``consume --pop``: receive, print, ack (unless ``--no-ack``)."""
    from common.client import SimpleConsumer

    if "," in args.topic or args.broadcasting:
        raise UsageError("--pop reads one topic, and cannot broadcast (POP hands each message "
                         "to one consumer of the group)")
    count = 0
    consumed: list[dict[str, Any]] = []
    with SimpleConsumer(args.servers, args.group, timeout_ms=args.timeout_ms,
                        **curve_args(args)) as consumer:
        idle_until = time.monotonic() + args.idle_s
        try:
            while (args.max <= 0 or count < args.max) and time.monotonic() < idle_until:
                want = 32 if args.max <= 0 else max(1, min(32, args.max - count))
                got = consumer.receive(args.topic, want, args.invisible_ms, wait_ms=500,
                                       fifo=args.fifo,
                                       from_newest=args.start == "latest")
                if got:
                    idle_until = time.monotonic() + args.idle_s
                for r in got:
                    count += 1
                    m = r.message
                    doc = {**m.to_json(), "reconsumeTimes": m.reconsume_times,
                           "receiptHandle": r.receipt_handle}
                    if args.json:
                        consumed.append(doc)
                    else:
                        body = doc["body"]
                        out.print(f"{m.topic}/{m.queue_id}@{m.queue_offset} "
                                  f"(reconsume {m.reconsume_times}) "
                                  f"{body if body is not None else f'<{len(m.body)} bytes>'}")
                if got and not args.no_ack:
                    for handle, why in consumer.ack_batch(got):
                        err.print(f"ack refused for {handle}: {why}")
        except KeyboardInterrupt:
            pass
    if args.json:
        emit_json({"group": args.group, "topics": [args.topic], "consumed": count,
                   "messages": consumed})
    else:
        acked = "received" if args.no_ack else "received and acked"
        err.print(f"{acked} {count} messages by POP as group {args.group}")
    return EXIT_OK


def cmd_dlq(args: argparse.Namespace) -> int:
    """A group's dead letters from its position in its DLQ; ``--resend`` re-drives them."""
    from common.client import dead_letters

    if args.max <= 0:
        raise UsageError("-n must be at least 1")
    with Consumer(args.servers, group=args.group, timeout_ms=args.timeout_ms,
                  **curve_args(args)) as consumer:
        every = dead_letters.read_all(consumer, args.max)  # one per broker group holding some
        resent = 0
        if args.resend and any(x.messages for x in every):
            with Producer(args.servers, timeout_ms=args.timeout_ms,
                          **curve_args(args)) as producer:
                for letters in every:
                    resent += len(dead_letters.redrive(producer, consumer, letters))
    rows = [{**m.to_json(), "originTopic": m.properties.get("RETRY_TOPIC", m.topic),
             "reconsumeTimes": m.reconsume_times} for x in every for m in x.messages]
    start = sum(x.start for x in every)
    end = sum(x.end for x in every)
    if args.json:
        doc = {"group": args.group, "fromOffset": start, "maxOffset": end,
               "resent": resent, "messages": rows}
        if len(every) > 1 or (every and every[0].broker_name):
            doc["brokers"] = [{"brokerName": x.broker_name, "fromOffset": x.start,
                               "maxOffset": x.end} for x in every]
        emit_json(doc)
        return EXIT_OK
    table = Table(title=f"dead letters of {args.group} (offset {start} of {end})")
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



