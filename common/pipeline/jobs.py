"""Operator jobs on Spark: ``audit``, ``stats``, ``reindex``.

    replog pipeline audit MASTER_STORE SLAVE_STORE [--require-identical] [--max-blocks N]
    replog pipeline audit (--group NAME=STORE,STORE[,...] ... | --cluster-dir DIR) [...]
    replog pipeline stats STORE [--output PARQUET_DIR] [--top N] [--topics T1,T2]
    replog pipeline reindex STORE [--write OUT_DIR] [--cq-file-bytes N]

Every job takes ``--json`` (one JSON document on stdout) and ``--spark-master`` (default
``local[2]``; ignored under ``spark-submit``, which sets the master itself). The same entry
point runs as ``spark-submit common/pipeline/jobs.py <job> ...``.

Exit status: 0 when the job ran and found nothing wrong, 1 when it found something (audit:
divergence, or any difference with ``--require-identical``; reindex: mismatching entries) or
failed, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from common.core.errors import StoreError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # exit status 2 through an exception, not sys.exit
        raise UsageError(f"{self.prog}: {message}")


class UsageError(Exception):
    """Bad command-line usage (exit status 2)."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="replog pipeline", description="Spark jobs over replog stores")
    sub = parser.add_subparsers(dest="job", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="one JSON document on stdout")
        p.add_argument("--spark-master", default=None, help="Spark master (default local[2])")

    p = sub.add_parser("audit", help="is the slave's CommitLog a byte copy of the master's? "
                       "(of every broker group: --group or --cluster-dir)")
    p.add_argument("stores", nargs="*", metavar="STORE", help="MASTER_STORE SLAVE_STORE")
    p.add_argument("--group", action="append", default=[], metavar="NAME=STORE,STORE",
                   help="a broker group's replicas, the reference first (repeat per group)")
    p.add_argument("--cluster-dir", help="a `replog cluster up` directory: every group's "
                   "replicas, compared with the most complete one")
    p.add_argument("--require-identical", action="store_true",
                   help="exit 1 unless both logs hold exactly the same bytes")
    p.add_argument("--max-blocks", type=int, default=16,
                   help="differing 1 MiB blocks to compare record by record")
    common(p)

    p = sub.add_parser("stats", help="per topic and minute: count, bytes, latency, top keys")
    p.add_argument("store")
    p.add_argument("--output", help="write the stats here as Parquet (overwritten)")
    p.add_argument("--top", type=int, default=5, help="top keys per row")
    p.add_argument("--topics", help="comma-separated topics (default all)")
    common(p)

    p = sub.add_parser("reindex", help="rebuild ConsumeQueues from the CommitLog and compare")
    p.add_argument("store")
    p.add_argument("--write", help="also write the rebuilt ConsumeQueue files under this dir")
    p.add_argument("--cq-file-bytes", type=int, default=300_000 * 20,
                   help="size of written ConsumeQueue files (mappedFileSizeConsumeQueue)")
    common(p)
    return parser


def _session(master: str | None) -> tuple[SparkSession, bool]:
    """The active session (kept) or a new one (stopped by the caller)."""
    from pyspark.sql import SparkSession

    from common.pipeline import register
    from common.pipeline.session import build_session

    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active, False
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit: its master, its conf
        spark = SparkSession.builder.getOrCreate()
        register(spark)
        return spark, True
    return build_session(master or "local[2]", app_name="replog-pipeline"), True


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _emit(doc: Any, as_json: bool, text: str) -> None:
    print(json.dumps(doc, default=_json_default, sort_keys=True) if as_json else text)


def run_job(spark: SparkSession, args: argparse.Namespace) -> int:
    """Run the parsed job on ``spark``; print its result; return the exit status."""
    if args.job == "audit":
        from common.pipeline.audit import (
            format_cluster_report,
            format_report,
            run_audit,
            run_cluster_audit,
        )

        groups = audit_groups(args)
        if groups is None:
            report = run_audit(spark, args.stores[0], args.stores[1], args.max_blocks)
            _emit(report.as_dict(), args.json, format_report(report))
            bad = report.divergent or (args.require_identical and not report.identical)
            return EXIT_FOUND if bad else EXIT_OK
        cluster = run_cluster_audit(spark, groups, args.max_blocks)
        _emit(cluster.as_dict(), args.json, format_cluster_report(cluster))
        bad = cluster.divergent or (args.require_identical and not cluster.identical)
        return EXIT_FOUND if bad else EXIT_OK
    if args.job == "stats":
        from common.pipeline.stats import format_table, run_stats

        options = {"topics": args.topics} if args.topics else None
        rows = run_stats(spark, args.store, args.output, args.top, options)
        _emit({"rows": rows, "output": args.output}, args.json, format_table(rows))
        return EXIT_OK
    if args.job == "reindex":
        from common.pipeline.reindex import format_report as format_reindex
        from common.pipeline.reindex import run_reindex

        result = run_reindex(spark, args.store, args.write, args.cq_file_bytes)
        _emit(result, args.json, format_reindex(result))
        return EXIT_OK if result["consistent"] else EXIT_FOUND
    raise UsageError(f"unknown job {args.job!r}")


def audit_groups(args: argparse.Namespace) -> dict[str, list[str]] | None:
    """The broker groups an audit compares (group -> replicas, the reference first), or None
    for the two positional stores (one group)."""
    modes = [bool(args.stores), bool(args.group), args.cluster_dir is not None]
    if sum(modes) != 1:
        raise UsageError("audit: give MASTER_STORE SLAVE_STORE, or --group NAME=STORE,STORE "
                         "(repeatable), or --cluster-dir DIR")
    if args.stores:
        if len(args.stores) != 2:
            raise UsageError("audit: MASTER_STORE SLAVE_STORE (two stores)")
        return None
    if args.cluster_dir is not None:
        from common.pipeline.layout import cluster_replicas, most_complete

        try:
            found = cluster_replicas(args.cluster_dir)
        except ValueError as e:
            raise UsageError(f"audit: {e}") from None
        out = {}
        for name, replicas in sorted(found.items()):
            reference = most_complete(replicas)
            out[name] = [reference, *(r for r in replicas if r != reference)]
        return out
    groups: dict[str, list[str]] = {}
    for item in args.group:
        name, sep, stores = item.partition("=")
        replicas = [x.strip() for x in stores.split(",") if x.strip()]
        if not sep or not name.strip() or len(replicas) < 2:
            raise UsageError(f"audit: --group {item!r} is not NAME=STORE,STORE[,...] "
                             "(two replicas at least)")
        if name.strip() in groups:
            raise UsageError(f"audit: group {name.strip()} given twice")
        groups[name.strip()] = replicas
    return groups


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``replog pipeline <job>`` and ``spark-submit jobs.py <job>``."""
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except UsageError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    spark, owned = _session(args.spark_master)
    try:
        return run_job(spark, args)
    except (StoreError, ValueError, OSError) as e:
        print(f"replog pipeline {args.job}: {e}", file=sys.stderr)
        return EXIT_FOUND
    finally:
        if owned:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
