"""SQL92 selectors (common/core/sql92.py), as RocketMQ's filter module reads them: numeric and
text comparisons, BETWEEN, IN, IS [NOT] NULL, CONTAINS / STARTSWITH / ENDSWITH, SQL's three
values; and the expressions refused when parsed, each with what is wrong."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.core.sql92 import SelectorError, compile_selector

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("text", "props", "matches"), [
    ("a > 5 AND b = 'x'", {"a": "10", "b": "x"}, True),
    ("a > 5 AND b = 'x'", {"a": "3", "b": "x"}, False),
    ("a >= 5 and a <= 5", {"a": "5"}, True),
    ("a < -1.5", {"a": "-2"}, True),
    ("a > 5", {"a": "ten"}, False),  # not a number: unknown, so no match
    ("NOT (a > 5)", {"a": "ten"}, False),  # NOT unknown is unknown
    ("a > 5", {}, False),
    ("NOT (a > 5)", {}, False),
    ("a IS NULL", {}, True),
    ("a IS NULL", {"a": ""}, False),
    ("a is not null", {"a": "1"}, True),
    ("a BETWEEN 0 AND 3", {"a": "3"}, True),
    ("a BETWEEN 0 AND 3", {"a": "3.5"}, False),
    ("a NOT BETWEEN 0 AND 3", {"a": "5"}, True),
    ("TAGS IN ('A', 'B')", {"TAGS": "B"}, True),
    ("TAGS IN ('A', 'B')", {"TAGS": "C"}, False),
    ("TAGS NOT IN ('A', 'B')", {"TAGS": "C"}, True),
    ("TAGS NOT IN ('A', 'B')", {}, False),  # NULL in anything: unknown
    ("a = 5", {"a": "5.0"}, True),  # a number: compared as numbers
    ("a = '5'", {"a": "5.0"}, False),  # a string: compared as text
    ("a <> 'x'", {"a": "y"}, True),
    ("a <> 'x'", {}, False),
    ("name CONTAINS 'bc'", {"name": "abcd"}, True),
    ("name NOT CONTAINS 'bc'", {"name": "abcd"}, False),
    ("name STARTSWITH 'ab' AND name ENDSWITH 'cd'", {"name": "abcd"}, True),
    ("name endswith 'ab'", {"name": "abcd"}, False),
    ("x = 1 OR y IS NULL", {"x": "2"}, True),  # unknown OR true
    ("x = 1 OR y = 2", {}, False),
    ("x = 1 AND y = 2", {"x": "1"}, False),  # true AND unknown
    ("TRUE", {}, True),
    ("FALSE OR a = 1", {"a": "1"}, True),
    ("s = 'it''s'", {"s": "it's"}, True),
    ("a.b_c$ = 1", {"a.b_c$": "1"}, True),
    ("ORDER = 1", {"ORDER": "1"}, True),  # a name that begins with a keyword
    ("((a = 1) AND (b = 2)) OR c = 3", {"c": "3"}, True),
])
def test_what_matches(text: str, props: dict[str, str], matches: bool) -> None:
    assert compile_selector(text).matches(props) is matches


@pytest.mark.parametrize(("text", "says"), [
    ("a > 'x'", "only numbers"),
    ("a BETWEEN 'a' AND 'c'", "only numbers"),
    ("a = NULL", "IS NULL"),
    ("a AND b", "cannot parse"),
    ("a", "cannot parse"),
    ("5", "cannot parse"),
    ("", "empty"),
    ("   ", "empty"),
    ("a BETWEEN 5 AND 1", "first bound"),
    ("a >", "cannot parse"),
    ("a IN (1)", "cannot parse"),
    ("(a = 1", "cannot parse"),
    ("a = 1 AND", "cannot parse"),
    ("a LIKE 'x%'", "cannot parse"),  # RocketMQ removed LIKE
    ("x" * 5000 + " = 1", "at most"),
    ("(" * 1000 + "a = 1" + ")" * 1000, "64 deep"),  # Python's recursion, not a refusal, once
    ("NOT " * 1000 + "a = 1", "64 deep"),
    ("NOT (" * 33 + "a = 1" + ")" * 33, "64 deep"),
    ("(" * 65 + "a = 1" + ")" * 65, "64 deep"),
])
def test_what_is_refused_says_why(text: str, says: str) -> None:
    with pytest.raises(SelectorError, match=says):
        compile_selector(text)


def test_a_selector_is_compiled_once_per_text() -> None:
    assert compile_selector("a = 1") is compile_selector("a = 1")


@given(st.integers(-10**6, 10**6), st.integers(-10**6, 10**6), st.integers(-10**6, 10**6))
def test_numeric_comparisons_agree_with_python(value: int, low: int, high: int) -> None:
    props = {"v": str(value)}
    assert compile_selector(f"v > {low}").matches(props) is (value > low)
    assert compile_selector(f"v <= {low}").matches(props) is (value <= low)
    assert compile_selector(f"v = {low}").matches(props) is (value == low)
    lo, hi = min(low, high), max(low, high)
    assert compile_selector(f"v BETWEEN {lo} AND {hi}").matches(props) is (lo <= value <= hi)
    assert compile_selector(f"v NOT BETWEEN {lo} AND {hi}").matches(props) is not (
        lo <= value <= hi)


@pytest.mark.parametrize("text", [
    "(" * 64 + "a = 1" + ")" * 64,
    "NOT " * 64 + "a = 1",
    "NOT (" * 32 + "a = 1" + ")" * 32,
    "(a = 2 OR (" * 32 + "a = 1" + "))" * 32,
    " AND ".join(["NOT (a = 2)"] * 200),  # wide, not deep
])
def test_an_expression_as_deep_as_allowed_compiles_and_runs_from_a_deep_stack(
        text: str) -> None:
    """At the nesting limit, parsed and evaluated with 300 frames already on the stack (a
    broker thread's request path), without a RecursionError."""
    def at_depth(frames: int) -> bool:
        if frames:
            return at_depth(frames - 1)
        return compile_selector.__wrapped__(text).matches({"a": "1"})

    assert at_depth(300) is True
