"""replog's data pipeline on Apache Spark (PySpark's Python Data Source API).

- ``spark.read.format("replog").load(STORE_DIR)``: the CommitLog as a DataFrame (``source``);
- ``spark.readStream.format("replog").option("servers", ...)``: tail a broker group (``stream``);
- ``df.write.format("replog").option("servers", ...).option("topic", ...)``: send rows (``sink``);
- ``python -m common.pipeline.jobs audit|stats|reindex``: operator jobs (``jobs``).

The format is found without registration when the ``pyspark_replog`` module is importable by
Spark's Python workers; ``register(spark)`` registers it explicitly and turns on the filter
pushdown the batch reader uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> None:
    """Register the ``replog`` format on ``spark`` and enable Python filter pushdown."""
    from .source import PushdownDataSource

    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(PushdownDataSource)
