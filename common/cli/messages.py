"""``replog send``, ``pull`` and ``query``: messages in and out."""

from __future__ import annotations

import argparse
import datetime
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    curve_args,
    emit_json,
    err,
    key_value_table,
    out,
    print_messages,
)
from common.client import (
    Admin,
    Consumer,
    Producer,
    SendResult,
    TransactionProducer,
    TransactionState,
)
from common.core.errors import BrokerError, ResponseCode, SendStatus


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
    timer = _timer_args(args)
    if args.transaction is not None:
        if args.count is not None or timer or args.delay_level or args.shard_key:
            raise UsageError("--transaction sends one message (-b or --file), not delayed, "
                             "timed or sharded")
        return _send_transaction(args)
    with Producer(args.servers, timeout_ms=args.timeout_ms, **curve_args(args),
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
                broker_name=args.broker_name,
                **timer,
            )
            return _print_sends(args, [result], single=True)
        results = _send_many(producer, args, timer)
    return _print_sends(args, results, single=False)


def _send_transaction(args: argparse.Namespace) -> int:
    """``--transaction``: the half, then the end asked for (the broker's check-back, should it
    come while this runs, gets the same answer)."""
    state = TransactionState(args.transaction.upper())
    body = args.body.encode("utf-8") if args.body is not None else Path(args.file).read_bytes()
    with TransactionProducer(args.servers, args.group, lambda _half: state,
                             timeout_ms=args.timeout_ms, **curve_args(args),
                             compress_over_bytes=args.compress_over or None) as producer:
        result = producer.send_in_transaction(args.topic, body, lambda _half: state, args.tags,
                                              args.keys, queue_id=args.queue,
                                              broker_name=args.broker_name)
    half = result.half.send
    error = result.end_error
    if args.json:
        emit_json({**half.to_json(), "transactionId": result.half.transaction_id,
                   "state": result.state.value,
                   "endError": None if error is None else f"{error.code.name}: {error.remark}"})
    else:
        out.print(key_value_table("transaction", [
            ("half", half.status.value), ("transactionId", result.half.transaction_id),
            ("brokerName", half.broker_name), ("commitLogOffset", half.commit_log_offset),
            ("state", result.state.value if error is None else
             f"{result.state.value} not sent: {error.code.name} {error.remark} (the broker "
             "will check back)"),
        ]))
    return EXIT_OK if half.status == SendStatus.SEND_OK and error is None else EXIT_FAILED


def _timer_args(args: argparse.Namespace) -> dict[str, Any]:
    """``--deliver-at`` / ``--delay`` as Producer.send's ``deliver_at`` / ``delay``."""
    given = [n for n, v in (("--delay-level", args.delay_level), ("--deliver-at", args.deliver_at),
                            ("--delay", args.delay)) if v]
    if len(given) > 1:
        raise UsageError(f"give one of {', '.join(given)}")
    if args.deliver_at:
        return {"deliver_at": parse_time(args.deliver_at)}
    if args.delay:
        return {"delay": parse_span(args.delay)}
    return {}


def parse_time(text: str) -> datetime.datetime | int:
    """An ISO 8601 time (``Z`` or an offset; none: local time) or epoch ms."""
    if text.isdigit():
        return int(text)
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--deliver-at {text!r} is neither an ISO 8601 time nor epoch ms") \
            from None


_SPAN_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_span(text: str) -> int:
    """``1500ms``, ``90s``, ``5m``, ``2h``, ``1d`` or a bare number of ms -> ms."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?", text.strip())
    if match is None:
        raise UsageError(f"--delay {text!r} is not a span (e.g. 1500ms, 90s, 5m, 2h, 1d)")
    return round(float(match.group(1)) * _SPAN_UNITS[match.group(2) or "ms"])


def cmd_recall(args: argparse.Namespace) -> int:
    with Producer(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as producer:
        key = producer.recall(args.topic, args.handle)
    if args.json:
        emit_json({"recalled": True, "topic": args.topic, "msgKey": key})
    else:
        out.print(f"recalled {key} in {args.topic}: it will not be delivered")
    return EXIT_OK


def _send_many(producer: Producer, args: argparse.Namespace,
               timer: dict[str, Any]) -> list[SendResult]:
    """``--count N --size BYTES``: pipelined sends with a progress bar (human mode)."""
    from rich.progress import Progress

    futures = []
    body_for = _body_maker(args.size)
    with Progress(console=err, disable=args.json or args.count < 100, transient=True) as progress:
        task = progress.add_task(f"sending {args.count} messages", total=args.count)
        if args.delay_level or timer:  # send_async batches, which cannot be delayed
            results = []
            for i in range(args.count):
                results.append(producer.send(args.topic, body_for(i), args.tags, args.keys,
                                             queue_id=args.queue, delay_level=args.delay_level,
                                             shard_key=args.shard_key,
                                             broker_name=args.broker_name, **timer))
                progress.advance(task)
            return results
        for i in range(args.count):
            futures.append(
                producer.send_async(
                    args.topic, body_for(i), args.tags, args.keys, queue_id=args.queue,
                    shard_key=args.shard_key, broker_name=args.broker_name,
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
            key_value_table(
                "send",
                [
                    ("status", r.status.value),
                    ("msgId", r.msg_id),
                    ("brokerName", r.broker_name),
                    ("queueId", r.queue_id),
                    ("queueOffset", r.queue_offset),
                    ("commitLogOffset", r.commit_log_offset),
                    *([("recallHandle", r.recall_handle)] if r.recall_handle else []),
                ],
            )
        )
    else:
        counts: dict[str, int] = {}
        for r in results:
            counts[r.status.value] = counts.get(r.status.value, 0) + 1
        out.print(key_value_table(f"sent {len(results)} messages", sorted(counts.items())))
    return EXIT_OK if ok else EXIT_FAILED


def cmd_pull(args: argparse.Namespace) -> int:
    with Consumer(args.servers, group=args.group, timeout_ms=args.timeout_ms,
                  **curve_args(args)) as consumer:
        offset = args.offset
        if offset is None:
            committed = consumer.fetch_offset(args.topic, args.queue,
                                              broker_name=args.broker_name)
            offset = max(0, committed)
        result = consumer.pull(args.topic, args.queue, offset, args.max,
                               suspend_ms=args.suspend_ms, broker_name=args.broker_name,
                               tags=args.tags, sql=args.sql)
        if not result.messages:
            _require_queue(consumer, args.topic, args.queue, args.broker_name)
    if args.json:
        emit_json(result.to_json())
    else:
        out.print(
            f"status={result.status.value} nextBeginOffset={result.next_begin_offset} "
            f"minOffset={result.min_offset} maxOffset={result.max_offset}"
        )
        print_messages(result.messages)
    return EXIT_OK



def _require_queue(consumer: Consumer, topic: str, queue: int, broker_name: str | None) -> None:
    """An empty answer from a queue that does not exist is an error, not "0 messages"."""
    try:
        nums = consumer.queue_nums(topic, broker_name=broker_name)
    except BrokerError as e:
        if e.code != ResponseCode.TOPIC_NOT_EXIST:
            raise
        raise BrokerError(ResponseCode.TOPIC_NOT_EXIST, f"there is no topic {topic} (nothing "
                          "was ever sent to it, nor was it created)", False) from None
    if not 0 <= queue < nums:
        raise BrokerError(ResponseCode.BAD_REQUEST,
                          f"topic {topic} has {nums} queue{'s' if nums != 1 else ''} "
                          f"(0..{nums - 1}): there is no queue {queue}", False)


def cmd_query(args: argparse.Namespace) -> int:
    modes = [args.key is not None, args.msg_id is not None, args.offset is not None]
    if sum(modes) != 1 or (args.key is not None and not args.topic):
        raise UsageError("give exactly one of --topic T --key K, --msg-id ID or --offset PHYOFFSET")
    with Admin(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as admin:
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
        print_messages(found)
    return EXIT_OK if found else EXIT_FAILED



