"""Fuzz SQL92 selector compilation (``common/core/sql92.py``): any text gives a compiled
Selector or SelectorError (the broker's SUBSCRIPTION_PARSE_FAILED), never another exception;
a compiled one evaluates over any properties to True or False without raising.

Input: a flags byte (which properties to evaluate over), then the expression (UTF-8,
undecodable bytes replaced).
Run: ``python fuzz/sql92_compile.py -max_total_time=600``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from fuzz._harness import Reader, instrumented, run, tolerated

with instrumented(__name__):
    from common.core.sql92 import SelectorError, compile_selector

NAME = "sql92_compile"
PROPERTIES = (
    {},
    {"a": "5", "b": "x", "TAGS": "A", "region": "eu", "name": "abc"},
    {"a": "not a number", "b": "", "c": "1e400", "d": "-0.0", "e": "NaN", "f": "9" * 5000},
    {"a": "1.5", "c": "7", "TAGS": "B", "x.y": "z", "$v": "'q'"},
)


def one_input(data: bytes) -> None:
    r = Reader(data)
    flags = r.byte()
    text = r.rest().decode("utf-8", "replace")
    compile_selector.cache_clear()  # each input parsed, not answered from the cache
    try:
        selector = compile_selector(text)
    except SelectorError:
        return
    except RecursionError:
        if tolerated("sql92-recursion"):
            return
        raise
    for props in PROPERTIES[flags % len(PROPERTIES):]:
        assert selector.matches(props) in (True, False)


def seeds() -> list[bytes]:
    texts = [
        "a > 5 AND b = 'x'",
        "(TAGS IN ('A', 'B')) AND (c BETWEEN 4 AND 7)",
        "a IS NULL",
        "a IS NOT NULL AND NOT (region = 'eu')",
        "name CONTAINS 'x'",
        "name STARTSWITH 'ab' OR name ENDSWITH 'yz'",
        "a NOT BETWEEN -1.5 AND 2 OR b NOT IN ('it''s')",
        "TRUE", "FALSE AND a <> 3", "a = NULL", "'x' > 3", "a", "5", "",
        "x.y = 'z' AND $v <> 'q' OR c >= 7 AND c <= 8 OR c < 1",
        "NOT NOT NOT a = 1", "b NOT CONTAINS 'q' AND b NOT STARTSWITH 'r'",
        "(" * 40 + "a = 1" + ")" * 40,
        "NOT " * 60 + "a = 1",
        " AND ".join(["a = 1"] * 60),
    ]
    out = [bytes([i % len(PROPERTIES)]) + t.encode() for i, t in enumerate(texts)]
    out.append(b"\x01" + b"(" * 400 + b"a = 1" + b")" * 400)  # deeper than Python's recursion
    return out


if __name__ == "__main__":
    run(NAME, one_input)
