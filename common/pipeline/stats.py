"""Stats: per topic and minute of store time, how much was stored and how fast.

| column         | meaning                                                            |
|----------------|--------------------------------------------------------------------|
| topic          |                                                                    |
| minute         | storeTimestamp truncated to the minute (UTC)                       |
| messages       | records stored                                                     |
| bytes          | CommitLog bytes (TOTALSIZE, headers included)                      |
| latencyP50Ms   | exact median of storeTimestamp - bornTimestamp, ms (linear interp.)|
| latencyP99Ms   | exact 99th percentile of the same                                  |
| topKeys        | up to ``top`` most frequent KEYS entries: array<struct<key,count>>, |
|                | most frequent first, ties by key                                   |

Only the columns it needs are decoded (a user schema on the replog source).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

STATS_COLUMNS = "topic string, storeTimestamp timestamp, bornTimestamp timestamp, storeSize int, keys string"
DEFAULT_TOP_KEYS = 5


def compute_stats(spark: SparkSession, store_dir: str, top: int = DEFAULT_TOP_KEYS,
                  options: dict[str, str] | None = None) -> DataFrame:
    """The stats DataFrame of a store directory, one row per (topic, minute)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    reader = spark.read.format("replog").schema(STATS_COLUMNS)
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    log = reader.load(store_dir).select(
        "topic",
        F.date_trunc("minute", "storeTimestamp").alias("minute"),
        "storeSize",
        (F.unix_millis("storeTimestamp") - F.unix_millis("bornTimestamp")).alias("latencyMs"),
        "keys",
    )
    totals = log.groupBy("topic", "minute").agg(
        F.count(F.lit(1)).alias("messages"),
        F.sum("storeSize").alias("bytes"),
        F.percentile("latencyMs", F.lit(0.5)).alias("latencyP50Ms"),
        F.percentile("latencyMs", F.lit(0.99)).alias("latencyP99Ms"),
    )
    keyed = (
        log.where(F.col("keys").isNotNull())
        .select("topic", "minute", F.explode(F.split("keys", " ")).alias("key"))
        .where(F.col("key") != "")
        .groupBy("topic", "minute", "key")
        .agg(F.count(F.lit(1)).alias("count"))
    )
    rank = Window.partitionBy("topic", "minute").orderBy(F.desc("count"), F.asc("key"))
    top_keys = (
        keyed.withColumn("rank", F.row_number().over(rank))
        .where(F.col("rank") <= top)
        .groupBy("topic", "minute")
        .agg(F.sort_array(F.collect_list(F.struct("rank", "key", "count"))).alias("ranked"))
        .select("topic", "minute",
                F.transform("ranked", lambda r: F.struct(r["key"].alias("key"),
                                                         r["count"].alias("count"))).alias("topKeys"))
    )
    return (
        totals.join(top_keys, ["topic", "minute"], "left")
        .withColumn("topKeys", F.coalesce("topKeys", F.array().cast("array<struct<key:string,count:bigint>>")))
        .orderBy("topic", "minute")
    )


def format_table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width text table of stats rows."""
    header = ("topic", "minute", "messages", "bytes", "p50 ms", "p99 ms", "top keys")
    body = []
    for r in rows:
        keys = ", ".join(f"{k['key']}({k['count']})" for k in r["topKeys"])
        body.append((
            r["topic"], r["minute"].strftime("%Y-%m-%d %H:%M"), str(r["messages"]), str(r["bytes"]),
            f"{r['latencyP50Ms']:.1f}", f"{r['latencyP99Ms']:.1f}", keys,
        ))
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h)
              for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in body]
    return "\n".join(lines)


def run_stats(spark: SparkSession, store_dir: str, output: str | None, top: int = DEFAULT_TOP_KEYS,
              options: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Compute the stats, write them as Parquet to ``output`` (overwrite) and return the rows."""
    df = compute_stats(spark, store_dir, top, options)
    if output:
        df.write.mode("overwrite").parquet(output)
        df = spark.read.parquet(output).orderBy("topic", "minute")
    return [row.asDict(recursive=True) for row in df.collect()]
