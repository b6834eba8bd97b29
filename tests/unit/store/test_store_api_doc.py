"""docs/store-api.md and common/store/api.py agree: each protocol's section of the document
names exactly the members the protocol declares (a member added to one and not the other
fails here), and MessageStore has every one of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from common.store import api
from common.store.message_store import MessageStore

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[3] / "docs" / "store-api.md"
PROTOCOLS = (api.ReadStore, api.WriteStore, api.ReplicationStore, api.Store)


def declared(proto: type) -> set[str]:
    """The members ``proto`` itself declares (methods, properties, annotated attributes)."""
    names = {n for n, v in vars(proto).items()
             if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    names |= {n for n in vars(proto).get("__annotations__", {}) if not n.startswith("_")}
    return names


def documented(name: str) -> set[str]:
    text = DOC.read_text()
    match = re.search(rf"^## {name}:.*?$(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert match is not None, f"docs/store-api.md has no section '## {name}: ...'"
    blocks = re.findall(r"```python\n(.*?)```", match.group(1), re.DOTALL)
    return set(re.findall(r"\bstore\.([a-z_]+)", "".join(blocks)))


@pytest.mark.parametrize("proto", PROTOCOLS, ids=lambda p: p.__name__)
def test_each_protocol_section_lists_exactly_its_members(proto: type) -> None:
    assert documented(proto.__name__) == declared(proto)


def test_the_message_store_has_every_member() -> None:
    """(mypy checks the types in ``make lint``; this runs with the tests.)"""
    attributes = _instance_attributes()
    for proto in PROTOCOLS:
        for name in declared(proto):
            assert hasattr(MessageStore, name) or name in attributes, name


def _instance_attributes() -> set[str]:
    source = Path(api.__file__).with_name("message_store.py").read_text()
    return set(re.findall(r"self\.([a-z_]+)(?::[^=\n]+)? = ", source))
