"""Lets Spark discover the ``replog`` format by module name (see ``common.pipeline``)."""
from common.pipeline.source import ReplogDataSource as DefaultSource  # noqa: F401
