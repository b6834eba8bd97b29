"""``replog timer status``: the timer of each broker given (``common/store/timer/``)."""

from __future__ import annotations

import argparse

from rich.table import Table

from common.cli.output import EXIT_OK, curve_args, emit_json, out
from common.client import Admin
from common.core.errors import BrokerError

COUNTERS = ("enqueued", "delivered", "rolled", "recalled", "skipped_delivered", "put_failures",
            "refused", "gated", "unreadable")


def cmd_timer(args: argparse.Namespace) -> int:
    rows = []
    with Admin(args.servers, timeout_ms=args.timeout_ms, retries=0, **curve_args(args)) as admin:
        for server in admin.servers:
            try:
                status = admin.status(server)
            except BrokerError as e:
                rows.append({"address": server, "error": e.remark})
                continue
            rows.append({"address": server, "role": status.get("role"),
                         **(status.get("timer") or {"enabled": False})})
    if args.json:
        emit_json(rows)
        return EXIT_OK
    table = Table(title="timer")
    for col in ("broker", "role", "pending", "due 1m", "due 1h", "due 1d", "behind ms",
                "late p50/p99/max ms", "enqueue lag", *COUNTERS):
        table.add_column(col)
    for r in rows:
        if "error" in r or not r.get("enabled"):
            table.add_row(r["address"], r.get("role", ""), r.get("error") or "timer off",
                          *[""] * (8 + len(COUNTERS)))
            continue
        within = r.get("pendingWithin") or {}
        table.add_row(
            r["address"], str(r.get("role")), str(r["pending"]), str(within.get("1m", 0)),
            str(within.get("1h", 0)), str(within.get("1d", 0)), str(r["behindMs"]),
            f"{r['latenessP50Ms']}/{r['latenessP99Ms']}/{r['latenessMaxMs']}",
            str(r["enqueueLag"]), *(str(r.get(c, 0)) for c in COUNTERS))
    out.print(table)
    return EXIT_OK
