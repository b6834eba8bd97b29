"""A consumer's subscription to a topic, as RocketMQ's ``SubscriptionData`` holds it: a TAG
expression (``*``, ``TagA || TagB``) or a SQL92 one over the message's properties
(``common/core/sql92.py``). The broker filters with it: a tag subscription first by the tag
hash code the ConsumeQueue holds, then by the tag itself (two tags can share a hash); a SQL92
one by the record's properties. A message that does not match never leaves the broker."""

from __future__ import annotations

from typing import NamedTuple

from common.core.message import subscribed_tags, tags_code
from common.core.sql92 import Selector, compile_selector

TAG = "TAG"
SQL92 = "SQL92"
EXPRESSION_TYPES = (TAG, SQL92)


class Subscription(NamedTuple):
    expression_type: str
    expression: str
    tags: frozenset[str] | None  # TAG: the tags subscribed (None: every message)
    selector: Selector | None  # SQL92: the compiled expression

    @property
    def codes(self) -> set[int] | None:
        """The tag hash codes a ConsumeQueue entry must carry (None: any)."""
        return None if self.tags is None else {tags_code(t) for t in self.tags}

    @property
    def filters(self) -> bool:
        return self.tags is not None or self.selector is not None


EVERYTHING = Subscription(TAG, "*", None, None)


def subscription(expression_type: str | None, expression: str | None) -> Subscription:
    """Read a subscription (the type defaults to TAG, an empty TAG expression to ``*``);
    ValueError naming what is wrong, SelectorError (a ValueError) for a SQL92 expression that
    cannot be parsed."""
    kind = (expression_type or TAG).upper()
    if kind == TAG:
        text = (expression or "*").strip() or "*"
        return Subscription(TAG, text, subscribed_tags(text), None)
    if kind == SQL92:
        return Subscription(SQL92, expression or "", None, compile_selector(expression or ""))
    raise ValueError(f"expressionType {expression_type!r}: TAG or SQL92")
