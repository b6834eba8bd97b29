"""``replog transactions``: the transactions the check-back gave up (``TRANS_CHECK_MAX_TIME_TOPIC``
on the master, after ``transactionCheckMax`` unanswered checks), and ending one by hand."""

from __future__ import annotations

import argparse
import time

from rich.table import Table

from common.cli.output import EXIT_OK, UsageError, curve_args, emit_json, out
from common.client import Admin
from common.core.errors import BrokerError, ResponseCode
from common.core.message import PROPERTY_REAL_TOPIC, MessageExt
from common.core.transaction import CHECK_TIMES, HALF_ORIGIN, PRODUCER_GROUP, TRANSACTION_ID


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="from_offset", type=int, default=0, metavar="N",
                   help="list from this queue offset of the check-max topic")
    p.add_argument("-n", "--max", type=int, default=32, help="list at most this many")
    p.add_argument("--end", type=int, metavar="OFFSET",
                   help="end the given-up transaction whose half is at this CommitLog offset "
                   "(as listed), with --commit or --rollback")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--commit", action="store_true", help="with --end: deliver it")
    how.add_argument("--rollback", action="store_true", help="with --end: drop it")


def row(half: MessageExt) -> dict[str, object]:
    props = half.properties
    origin = props.get(HALF_ORIGIN, "")
    return {"offset": half.commit_log_offset, "queueOffset": half.queue_offset,
            "origin": int(origin) if origin.isdigit() else None,
            "topic": props.get(PROPERTY_REAL_TOPIC, ""), "group": props.get(PRODUCER_GROUP, ""),
            "transactionId": props.get(TRANSACTION_ID, ""),
            "checks": int(props.get(CHECK_TIMES, "0") or 0), "bornTimestamp": half.born_timestamp,
            "bodyBytes": len(half.body)}


def cmd_transactions(args: argparse.Namespace) -> int:
    if (args.commit or args.rollback) and args.end is None:
        raise UsageError("--commit and --rollback go with --end OFFSET")
    if args.end is not None and not (args.commit or args.rollback):
        raise UsageError("--end OFFSET needs --commit or --rollback")
    if not 1 <= args.max <= 1024 or args.from_offset < 0:
        raise UsageError("--max must be 1..1024 and --from >= 0")
    with Admin(args.servers, timeout_ms=args.timeout_ms, retries=0, **curve_args(args)) as admin:
        if args.end is not None:
            return _end(admin, args)
        halves, next_offset, max_offset = admin.given_up_transactions(args.from_offset,
                                                                      args.max)
    rows = [row(h) for h in halves]
    if args.json:
        emit_json({"givenUp": rows, "nextOffset": next_offset, "maxOffset": max_offset})
        return EXIT_OK
    table = Table(title=f"transactions given up (queue offsets {args.from_offset}.."
                        f"{next_offset} of {max_offset})")
    for col in ("offset", "origin", "topic", "group", "transactionId", "checks", "born"):
        table.add_column(col)
    for half, r in zip(halves, rows, strict=True):
        born = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(half.born_timestamp / 1000))
        table.add_row(str(r["offset"]), str(r["origin"]), str(r["topic"]), str(r["group"]),
                      str(r["transactionId"]), str(r["checks"]), born)
    out.print(table)
    if not rows:
        out.print("none: every transaction was decided, or is still being checked")
    return EXIT_OK


def _given_up_at(admin: Admin, phy_offset: int) -> MessageExt | None:
    """The given-up half at CommitLog offset ``phy_offset``, found in the admin's listing (a
    look-up by offset refuses a record of a system topic to every account)."""
    offset, end = 0, None
    while end is None or offset < end:
        halves, next_offset, end = admin.given_up_transactions(offset, 1024)
        for half in halves:
            if half.commit_log_offset == phy_offset:
                return half
        if next_offset <= offset:
            return None
        offset = next_offset
    return None


def _end(admin: Admin, args: argparse.Namespace) -> int:
    found = _given_up_at(admin, args.end)
    if found is None or PROPERTY_REAL_TOPIC not in found.properties:
        raise BrokerError(ResponseCode.QUERY_NOT_FOUND,
                          f"no half message starts at CommitLog offset {args.end} (list them "
                          "with replog transactions)", False)
    answer = admin.end_given_up(found, commit=args.commit)
    state = "COMMIT" if args.commit else "ROLLBACK"
    doc = {**row(found), "state": state, "repeated": bool(answer.get("repeated"))}
    if args.json:
        emit_json(doc)
    else:
        out.print(f"{state.lower()} transaction {doc['transactionId']} (topic "
                  f"{doc['topic']}, group {doc['group']})"
                  + (": it was so decided already" if doc["repeated"] else ""))
    return EXIT_OK
