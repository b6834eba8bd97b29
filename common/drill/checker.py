"""The drill checker (docs/drills.md "Checker"): Jepsen's total-queue over the history and the
final drain, failover and recovery times, and the verdict every drill reports.

Figures of ``check_total_queue``: lost (ok, never in the final drain), unexpected (read, never
attempted), duplicated, recovered (info found), failed-but-read (a "fail" that is on the log:
a lie to the producer), corrupt bodies, and gaps in a queue's offsets.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

FinalDrain = dict[Any, list[tuple[int, str, bool]]]  # queue (or (group, queue)) -> [(offset, msg_id, crc ok)]
PROBLEM_KEYS = ("lost", "unexpected", "failed_but_read", "corrupt", "queue_gaps")


def check_total_queue(events: list[dict[str, Any]], final: FinalDrain) -> dict[str, Any]:
    """Total-queue figures from the history and the final drain of the master."""
    outcome: dict[str, str] = {}
    attempted: set[str] = set()
    read: set[str] = set()
    corrupt = 0
    for e in events:
        if e["op"] == "put":
            if e["type"] == "invoke":
                attempted.add(e["msg_id"])
            else:
                outcome[e["msg_id"]] = e["type"]
        elif e["op"] == "get" and e["type"] == "ok":
            read.add(e["msg_id"])
            corrupt += e.get("status") == "CORRUPT"
    final_ids: Counter[str] = Counter()
    gaps = 0
    for rows in final.values():
        expected = rows[0][0] if rows else 0
        for offset, msg_id, ok in rows:
            final_ids[msg_id] += 1
            corrupt += not ok
            gaps += offset != expected
            expected = offset + 1
    read |= set(final_ids)
    ok_ids = {m for m, t in outcome.items() if t == "ok"}
    info_ids = {m for m, t in outcome.items() if t == "info"}
    fail_ids = {m for m, t in outcome.items() if t == "fail"}
    lost = sorted(ok_ids - set(final_ids))
    unexpected = sorted(read - attempted)
    failed_read = sorted(fail_ids & read)
    return {
        "attempted": len(attempted),
        "ok": len(ok_ids),
        "fail": len(fail_ids),
        "info": len(info_ids),
        "lost": len(lost),
        "unexpected": len(unexpected),
        "duplicated": sum(n - 1 for n in final_ids.values() if n > 1),
        "recovered": len(info_ids & set(final_ids)),
        "failed_but_read": len(failed_read),
        "corrupt": corrupt,
        "queue_gaps": gaps,
        "final_messages": sum(final_ids.values()),
        "lost_ids": lost[:20],
        "lost_ids_all": lost,
        "unexpected_ids": unexpected[:20],
        "failed_read_ids": failed_read[:20],
    }


def judge(
    summary: dict[str, Any],
    *,
    logs_identical: bool,
    compared_range: list[int],
    replica_drains_equal: bool,
    loss_allowed: Callable[[str], bool] | None = None,
) -> list[str]:
    """The problems of a finished run (empty: it passed). ``summary`` is
    ``check_total_queue``'s; ``loss_allowed`` (e.g. ASYNC: acked bytes the new master never
    had) takes lost ids out of ``lost`` into ``lost_allowed``. Leaves no id list unbounded."""
    all_lost = summary.pop("lost_ids_all", None)
    if loss_allowed is not None:
        allowed = {m for m in (all_lost or []) if loss_allowed(m)}
        summary["lost_allowed"] = len(allowed)
        summary["lost"] -= len(allowed)
        summary["lost_ids"] = [m for m in summary["lost_ids"] if m not in allowed]
    problems = [f"{key}={summary[key]}" for key in PROBLEM_KEYS if summary[key]]
    if not logs_identical:
        problems.append(f"replica CommitLogs differ in {compared_range}")
    if not replica_drains_equal:
        problems.append("replicas serve different messages")
    return problems


def put_latencies_ms(
    events: list[dict[str, Any]], t0: float, t1: float = float("inf")
) -> list[float]:
    """Sorted latencies (ms) of the puts invoked in [t0, t1) that got SEND_OK."""
    invoked: dict[str, float] = {}
    out = []
    for e in events:
        if e["op"] != "put":
            continue
        if e["type"] == "invoke":
            invoked[e["msg_id"]] = e["t"]
        elif e["type"] == "ok":
            t = invoked.get(e["msg_id"])
            if t is not None and t0 <= t < t1:
                out.append((e["t"] - t) * 1000)
    return sorted(out)


def rto_after(events: list[dict[str, Any]], t_fault: float,
              handled_by: Callable[[str], bool] | None = None) -> float | None:
    """Seconds from a fault to the first SEND_OK invoked after it (None: none); with
    ``handled_by``, the first whose storing broker (``handler``, ip:port) it accepts: e.g. not
    the faulted master, which may rightly acknowledge until its lease runs out."""
    invoked: dict[str, float] = {}
    for e in events:
        if e["op"] != "put":
            continue
        if e["type"] == "invoke":
            invoked[e["msg_id"]] = e["t"]
        elif e["type"] == "ok" and invoked.get(e["msg_id"], -1.0) >= t_fault and (
                handled_by is None or handled_by(e.get("handler", "?"))):
            return round(e["t"] - t_fault, 3)
    return None


def percentiles(values: Iterable[float]) -> dict[str, float | None]:
    """p50 and max of ``values`` (None for both when there are none)."""
    done = sorted(values)
    if not done:
        return {"p50": None, "max": None}
    return {"p50": round(statistics.median(done), 3), "max": round(done[-1], 3)}
