"""A local SparkSession configured the way replog's pipeline needs it on these machines.

Environment (read by the JVM and the Python workers it spawns, so set before the JVM starts):
``SPARK_LOCAL_IP=127.0.0.1`` (stay on loopback), ``PYSPARK_PYTHON`` = this interpreter (the
workers need pyarrow and this package), ``PYTHONPATH`` gains the directory holding ``common``
(workers must import the data source by reference), ``JAVA_HOME`` pinned to Java 17 when present.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from . import PUSHDOWN_CONF, register

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA17 = Path("/usr/lib/jvm/java-17-openjdk-amd64")
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def prepare_environment() -> None:
    """Set the variables the JVM and the Python workers inherit (idempotent)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if JAVA17.is_dir():
        os.environ.setdefault("JAVA_HOME", str(JAVA17))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(PROJECT_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *paths])


def build_session(
    master: str = "local[2]",
    app_name: str = "replog-pipeline",
    driver_memory: str = "1g",
    extra_conf: dict[str, str] | None = None,
    register_source: bool = True,
) -> SparkSession:
    """A SparkSession with the UI off and few shuffle partitions. ``register_source`` registers
    the replog format explicitly (without it Spark finds it through ``pyspark_replog``)."""
    prepare_environment()
    from pyspark.sql import SparkSession

    warehouse = Path(tempfile.gettempdir()) / f"replog-spark-warehouse-{os.getpid()}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.sql.session.timeZone", "UTC")
        .config(PUSHDOWN_CONF, "true")
    )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if register_source:
        register(spark)
    return spark
