"""SQL92 message selectors, as RocketMQ's ``filter`` module reads them (``MessageSelector.bySql``):
a boolean expression over a message's properties, evaluated on the broker.

    a > 5 AND b = 'x'          (TAGS IN ('A', 'B')) AND (c BETWEEN 4 AND 7)
    a IS NULL                  a IS NOT NULL AND NOT (region = 'eu')
    name CONTAINS 'x'          name STARTSWITH 'ab' OR name ENDSWITH 'yz'

The grammar is RocketMQ's (its JavaCC ``SelectorParser``), parsed with Lark: keywords in any
case; identifiers of letters, digits, ``_``, ``$`` and ``.``; strings in single quotes (``''``
is a quote); numbers (integers or decimals, a leading ``-``); ``TRUE``, ``FALSE``, ``NULL``;
operators ``=``, ``<>``, ``>``, ``>=``, ``<``, ``<=``, ``BETWEEN``, ``IN``, ``IS [NOT] NULL``,
``CONTAINS``, ``STARTSWITH``, ``ENDSWITH`` (each with ``NOT``), ``AND``, ``OR``, ``NOT``.

Values: a property is its text, or NULL when the message does not carry it. ``>``, ``>=``,
``<``, ``<=`` and ``BETWEEN`` compare numbers (a string or boolean literal there is refused when
the expression is parsed; a property that is not a number makes the comparison unknown, as
RocketMQ's evaluation error makes it not match). ``=`` and ``<>`` compare a property with a
number numerically, with a string as text. ``IN`` takes string literals. Logic is SQL's three
values: a comparison with NULL is unknown, and a message matches only when the whole
expression is TRUE.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import LarkError, VisitError

MAX_EXPRESSION_CHARS = 4096
# parentheses and NOTs one inside another: the parser and the compiled selector recurse once
# (or a few times) a level, and a deeper expression would exhaust Python's recursion
MAX_NESTING = 64

_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*          -> or_
?and_expr: not_expr (_AND not_expr)*        -> and_
?not_expr: _NOT not_expr                    -> not_
         | predicate
?predicate: value COMPARE value                          -> compare
          | value _IS _NULL                              -> is_null
          | value _IS _NOT _NULL                         -> is_not_null
          | value _BETWEEN value _AND value              -> between
          | value _NOT _BETWEEN value _AND value         -> not_between
          | value _IN "(" string ("," string)* ")"       -> in_
          | value _NOT _IN "(" string ("," string)* ")"  -> not_in
          | value TEXT_OP string                         -> text_op
          | value _NOT TEXT_OP string                    -> not_text_op
          | "(" or_expr ")"
          | TRUE                                         -> true
          | FALSE                                        -> false
?value: NAME                                -> prop
      | NUMBER                              -> number
      | string
      | TRUE                                -> true
      | FALSE                               -> false
      | _NULL                               -> null
string: STRING
COMPARE: ">=" | "<=" | "<>" | ">" | "<" | "="
TEXT_OP.2: /CONTAINS\b/i | /STARTSWITH\b/i | /ENDSWITH\b/i
_OR.2: /OR\b/i
_AND.2: /AND\b/i
_NOT.2: /NOT\b/i
_IS.2: /IS\b/i
_NULL.2: /NULL\b/i
_BETWEEN.2: /BETWEEN\b/i
_IN.2: /IN\b/i
TRUE.2: /TRUE\b/i
FALSE.2: /FALSE\b/i
NAME: /[A-Za-z_$][A-Za-z0-9_$.]*/
NUMBER: /-?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?[lLfFdD]?/
STRING: /'([^']|'')*'/
%ignore /[ \t\r\n]+/
"""

_PARSER = Lark(_GRAMMAR, parser="lalr", maybe_placeholders=False)


class SelectorError(ValueError):
    """An expression that cannot be a selector: what is wrong, and where."""


# An evaluated value: a property's text, a number, a boolean, or None (NULL / unknown).
Value = Any
Node = Callable[[Mapping[str, str]], Value]


def _as_number(value: Value) -> float | int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return value
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return None


class _Constant:
    """A literal: kept apart from properties so the parse can check how it is used."""

    def __init__(self, value: Value):
        self.value = value

    def __call__(self, _props: Mapping[str, str]) -> Value:
        return self.value


_ORDER = {">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0,
          "<=": lambda c: c <= 0}


def _numeric_operand(node: Node, op: str) -> None:
    if isinstance(node, _Constant) and (isinstance(node.value, bool | str)
                                        or node.value is None):
        raise SelectorError(f"{node.value!r} cannot be compared by {op}: only numbers can")
    if not isinstance(node, _Constant | _Property):
        raise SelectorError(f"a condition cannot be compared by {op}")


class _Property:
    def __init__(self, name: str):
        self.name = name

    def __call__(self, props: Mapping[str, str]) -> Value:
        return props.get(self.name)


def _ordered(left: Node, op: str, right: Node) -> Node:
    _numeric_operand(left, op)
    _numeric_operand(right, op)
    test = _ORDER[op]

    def node(props: Mapping[str, str]) -> Value:
        lv, rv = _as_number(left(props)), _as_number(right(props))
        if lv is None or rv is None:
            return None
        return test((lv > rv) - (lv < rv))

    return node


def _equal(left: Node, right: Node, negate: bool) -> Node:
    for side in (left, right):
        if isinstance(side, _Constant) and side.value is None:
            raise SelectorError("NULL cannot be compared by = or <>: use IS NULL")

    def node(props: Mapping[str, str]) -> Value:
        lv, rv = left(props), right(props)
        if lv is None or rv is None:
            return None
        if isinstance(lv, bool) or isinstance(rv, bool):
            same = lv is rv if isinstance(lv, bool) and isinstance(rv, bool) else False
        elif isinstance(lv, str) and isinstance(rv, str):
            same = lv == rv
        else:  # a number on one side at least: compare as numbers
            ln, rn = _as_number(lv), _as_number(rv)
            same = ln is not None and rn is not None and ln == rn
        return same != negate

    return node


def _not(value: Value) -> Value:
    return None if value is None else not value


@v_args(inline=True)
class _Build(Transformer[Token, Node]):
    """The parse tree into a tree of closures (compiled once, evaluated per message)."""

    def prop(self, name: Token) -> Node:
        return _Property(str(name))

    def number(self, text: Token) -> Node:
        raw = str(text).rstrip("lLfFdD")
        value: int | float
        try:
            value = int(raw)
        except ValueError:
            value = float(raw)
        return _Constant(value)

    def string(self, text: Token) -> Node:
        return _Constant(str(text)[1:-1].replace("''", "'"))

    def true(self, _token: Token) -> Node:
        return _Constant(True)

    def false(self, _token: Token) -> Node:
        return _Constant(False)

    def null(self) -> Node:
        return _Constant(None)

    def compare(self, left: Node, op: Token, right: Node) -> Node:
        if op in ("=", "<>"):
            return _equal(left, right, negate=op == "<>")
        return _ordered(left, str(op), right)

    def is_null(self, value: Node) -> Node:
        return lambda props: value(props) is None

    def is_not_null(self, value: Node) -> Node:
        return lambda props: value(props) is not None

    def between(self, value: Node, low: Node, high: Node) -> Node:
        if isinstance(low, _Constant) and isinstance(high, _Constant):
            lo, hi = _as_number(low.value), _as_number(high.value)
            if lo is not None and hi is not None and lo > hi:
                raise SelectorError(f"BETWEEN {low.value} AND {high.value}: the first bound "
                                    "must not be above the second")
        above, below = _ordered(value, ">=", low), _ordered(value, "<=", high)
        return lambda props: _and(above(props), below(props))

    def not_between(self, value: Node, low: Node, high: Node) -> Node:
        inside = self.between(value, low, high)
        return lambda props: _not(inside(props))

    def in_(self, value: Node, *items: Node) -> Node:
        if not isinstance(value, _Property):
            raise SelectorError("IN needs a property on its left")
        wanted = frozenset(item.value for item in items)  # type: ignore[attr-defined]

        def node(props: Mapping[str, str]) -> Value:
            got = value(props)
            return None if got is None else got in wanted

        return node

    def not_in(self, value: Node, *items: Node) -> Node:
        inside = self.in_(value, *items)
        return lambda props: _not(inside(props))

    def text_op(self, value: Node, op: Token, text: Node) -> Node:
        needle = text.value  # type: ignore[attr-defined]
        kind = str(op).upper()
        test: Callable[[str], bool] = (
            (lambda s: needle in s) if kind == "CONTAINS" else
            (lambda s: s.startswith(needle)) if kind == "STARTSWITH" else
            (lambda s: s.endswith(needle)))

        def node(props: Mapping[str, str]) -> Value:
            got = value(props)
            return None if not isinstance(got, str) else test(got)

        return node

    def not_text_op(self, value: Node, op: Token, text: Node) -> Node:
        inside = self.text_op(value, op, text)
        return lambda props: _not(inside(props))

    def not_(self, inner: Node) -> Node:
        _condition(inner)
        return lambda props: _not(inner(props))

    def and_(self, *parts: Node) -> Node:
        for p in parts:
            _condition(p)

        def node(props: Mapping[str, str]) -> Value:
            result: Value = True
            for p in parts:
                result = _and(result, p(props))
                if result is False:
                    return False
            return result

        return node

    def or_(self, *parts: Node) -> Node:
        for p in parts:
            _condition(p)

        def node(props: Mapping[str, str]) -> Value:
            result: Value = False
            for p in parts:
                v = p(props)
                if v is True:
                    return True
                if v is None:
                    result = None
            return result

        return node


def _condition(node: Node) -> None:
    """A bare property or a number is not a condition (RocketMQ refuses ``a AND b``)."""
    if isinstance(node, _Property) or (isinstance(node, _Constant)
                                       and not isinstance(node.value, bool)):
        raise SelectorError("AND, OR and NOT join conditions (a comparison, IN, IS NULL, ...), "
                            "not bare values")


def _and(a: Value, b: Value) -> Value:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


class Selector:
    """A compiled SQL92 selector: ``matches(properties)`` is True only when the expression
    is TRUE for them (FALSE and unknown do not match)."""

    def __init__(self, text: str, node: Node):
        self.text = text
        self._node = node

    def matches(self, properties: Mapping[str, str]) -> bool:
        return self._node(properties) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


@functools.lru_cache(maxsize=1024)
def compile_selector(text: str) -> Selector:
    """Parse ``text`` once (cached by text): SelectorError saying what is wrong."""
    if not text or not text.strip():
        raise SelectorError("an empty SQL92 expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise SelectorError(f"a SQL92 expression of at most {MAX_EXPRESSION_CHARS} characters")
    try:
        if _nesting(text) > MAX_NESTING:
            raise SelectorError(f"a SQL92 expression nests parentheses and NOTs at most "
                                f"{MAX_NESTING} deep")
        tree = _PARSER.parse(text)
        node = _Build().transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, SelectorError):
            raise e.orig_exc from None
        raise SelectorError(f"cannot read {text!r}: {e.orig_exc}") from None
    except LarkError as e:
        raise SelectorError(f"cannot parse {text!r}: {_first_line(e)}") from None
    except RecursionError:  # parsed from a deep stack already: refused, not a broker fault
        raise SelectorError("a SQL92 expression too deep to parse here") from None
    if isinstance(node, _Property) or (isinstance(node, _Constant)
                                       and not isinstance(node.value, bool)):
        raise SelectorError(f"{text!r} is a value, not a condition")
    return Selector(text, node)


def _nesting(text: str) -> int:
    """How deep ``text`` nests, from its tokens alone (a lexer does not recurse): the open
    parentheses around its deepest part and the NOTs in a row at each of them (an AND or an
    OR ends a row: NOT binds tighter). Counts no further past MAX_NESTING."""
    rows = [0]  # NOTs in a row at each open parenthesis
    depth = deepest = 0
    for token in _PARSER.lex(text):
        kind = token.type
        if kind == "_NOT":
            rows[-1] += 1
            depth += 1
        elif kind == "LPAR":
            rows.append(0)
            depth += 1
        elif kind == "RPAR" and len(rows) > 1:
            depth -= 1 + rows.pop()
        elif kind in ("_AND", "_OR"):
            depth -= rows[-1]
            rows[-1] = 0
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING:
            break
    return deepest


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
