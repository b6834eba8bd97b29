"""What every ``replog`` command prints with: consoles, JSON documents, tables, exit codes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from common.core.errors import BrokerError
from common.core.keys import KeyFileError, parse_server_keys

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# Piped to a file or another program, tables keep their whole lines (addresses, log paths):
# rich would cut them at 80 columns
out = Console(highlight=False, width=None if sys.stdout.isatty() else 4096)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 4096)


class UsageError(Exception):
    """Bad command-line usage (exit status 2)."""



def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, default=str) + "\n")
    sys.stdout.flush()


def curve_args(args: argparse.Namespace) -> dict[str, Any]:
    """A client command's ``--key`` / ``--server-key`` (or REPLOG_KEY / REPLOG_SERVER_KEY) as
    the clients' ``key`` / ``server_key`` arguments (docs/security.md)."""
    server_key: Any = args.server_key
    if server_key:
        try:
            server_key = parse_server_keys(server_key)
        except KeyFileError as e:
            raise UsageError(str(e)) from None
    return {"key": args.curve_key or None, "server_key": server_key or None}


def error_doc(e: BrokerError) -> dict[str, Any]:
    return {"error": e.code.name, "remark": e.remark, "retriable": e.retriable}



def key_value_table(title: str, rows: Sequence[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for name, value in rows:
        table.add_row(name, str(value))
    return table



def print_messages(messages: Sequence[Any]) -> None:
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



