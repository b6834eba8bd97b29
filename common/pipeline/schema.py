"""The DataFrame schema of a replog CommitLog: one row per stored message.

The first twelve columns are the contract's JSON message (section 3), with its meanings:
``body`` is the body as UTF-8 text, or null when it is not valid UTF-8, and ``bodyBase64`` is
always the body's base64; the two timestamps are Spark timestamps (UTC, millisecond precision)
rather than the JSON's integers, so that time functions and windows apply directly. After them
come the record fields an operator needs when looking at the log itself, ``bodyBytes`` (the
body's bytes) first. The three body columns hold the body as its producer sent it: a BODY
stored deflated (SYSFLAG COMPRESSED, ``sysFlag & 1``) is inflated, as a consumer gets it;
``bodyCrc`` and ``storeSize`` still describe the stored record.

| column                     | Spark type            | from the record                          |
|----------------------------|-----------------------|------------------------------------------|
| topic                      | string                | TOPIC                                    |
| queueId                    | int                   | QUEUEID                                  |
| queueOffset                | bigint                | QUEUEOFFSET                              |
| commitLogOffset            | bigint                | PHYSICALOFFSET                           |
| msgId                      | string                | store host + PHYSICALOFFSET (offsetMsgId)|
| bornTimestamp              | timestamp             | BORNTIMESTAMP (ms)                       |
| storeTimestamp             | timestamp             | STORETIMESTAMP (ms)                      |
| tags                       | string                | property TAGS                            |
| keys                       | string                | property KEYS                            |
| properties                 | map<string,string>    | PROPERTIES                               |
| body                       | string                | BODY* as UTF-8 text, null if it is not   |
| bodyBase64                 | string                | BODY* in base64                          |
| bodyBytes                  | binary                | BODY* (*: inflated if COMPRESSED)        |
| bornHost                   | string                | BORNHOST as ``ip:port``                  |
| storeHost                  | string                | STOREHOSTADDRESS as ``ip:port``          |
| sysFlag                    | int                   | SYSFLAG                                  |
| bodyCrc                    | int                   | BODYCRC                                  |
| storeSize                  | int                   | TOTALSIZE                                |
| flag                       | int                   | FLAG                                     |
| reconsumeTimes             | int                   | RECONSUMETIMES                           |
| preparedTransactionOffset  | bigint                | PREPAREDTRANSACTIONOFFSET                |
| tagsCode                   | bigint                | ConsumeQueue tagsCode: Java hashCode(TAGS)|
| brokerName                 | string                | the broker group the store belongs to    |
|                            |                       | (not in the record: the source names it) |

A user schema (``spark.read.schema(...)``) may name any subset of these columns, in any order;
the reader then decodes only those (the Python Data Source API has no column pruning of its
own, so the schema is how a job asks for less).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

if TYPE_CHECKING:
    import pyarrow as pa

COLUMNS: tuple[tuple[str, DataType], ...] = (
    ("topic", StringType()),
    ("queueId", IntegerType()),
    ("queueOffset", LongType()),
    ("commitLogOffset", LongType()),
    ("msgId", StringType()),
    ("bornTimestamp", TimestampType()),
    ("storeTimestamp", TimestampType()),
    ("tags", StringType()),
    ("keys", StringType()),
    ("properties", MapType(StringType(), StringType())),
    ("body", StringType()),
    ("bodyBase64", StringType()),
    ("bodyBytes", BinaryType()),
    ("bornHost", StringType()),
    ("storeHost", StringType()),
    ("sysFlag", IntegerType()),
    ("bodyCrc", IntegerType()),
    ("storeSize", IntegerType()),
    ("flag", IntegerType()),
    ("reconsumeTimes", IntegerType()),
    ("preparedTransactionOffset", LongType()),
    ("tagsCode", LongType()),
    ("brokerName", StringType()),
)
COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _ in COLUMNS)
_TYPES = dict(COLUMNS)

FULL_SCHEMA = StructType([StructField(name, dtype, True) for name, dtype in COLUMNS])


def check_schema(schema: StructType) -> tuple[str, ...]:
    """The column names of a user schema; ValueError unless it is a subset of FULL_SCHEMA."""
    names = []
    for field in schema.fields:
        expected = _TYPES.get(field.name)
        if expected is None:
            raise ValueError(
                f"replog has no column {field.name!r}; columns are {', '.join(COLUMN_NAMES)}"
            )
        if field.dataType != expected:
            hint = ("; the raw bytes are column bodyBytes binary"
                    if field.name == "body" else "")
            raise ValueError(
                f"column {field.name!r} is {expected.simpleString()}, "
                f"not {field.dataType.simpleString()}{hint}"
            )
        names.append(field.name)
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate columns in schema: {names}")
    return tuple(names)


def arrow_schema(names: tuple[str, ...]) -> pa.Schema:
    """The Arrow schema Spark expects from ``read()`` for these columns (checked by equality)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    struct = StructType([StructField(name, _TYPES[name], True) for name in names])
    return to_arrow_schema(struct, timezone="UTC")
