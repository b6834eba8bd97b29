"""docs/tests.md's features-to-tests table names test files that exist, and every test file
of the tree is named there (a new test file says which feature it holds)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]
DOC = TESTS.parent / "docs" / "tests.md"


def named_files() -> set[str]:
    """Test files the table names, relative to tests/ (``x.py`` after ``dir/y.py`` in a cell
    is ``dir/x.py``)."""
    text = DOC.read_text()
    table = text[text.index("## Features and the tests that hold them"):]
    found: set[str] = set()
    for line in table.splitlines():
        if not line.startswith("|"):
            continue
        cells = line.strip("|").split("|")
        base = ""
        for item in re.findall(r"`([^`]+)`", cells[-1]):
            if "/" in item:
                base = item.rsplit("/", 1)[0] if item.endswith(".py") else item.rstrip("/")
                if item.endswith(".py"):
                    found.add(item)
                else:
                    found.add(item.rstrip("/") + "/")
            elif item.endswith(".py"):
                found.add(f"{base}/{item}" if base else item)
    return found


def test_the_table_names_existing_files() -> None:
    for name in named_files():
        assert (TESTS / name).exists(), f"docs/tests.md names {name}, which does not exist"


def test_every_test_file_is_in_the_table() -> None:
    named = named_files()
    dirs = {n for n in named if n.endswith("/")}
    missing = []
    for path in sorted(TESTS.rglob("test_*.py")):
        rel = str(path.relative_to(TESTS))
        if rel in named or any(rel.startswith(d) for d in dirs) or rel == "unit/test_layering.py" \
                or rel == "unit/test_tests_table.py":
            continue
        missing.append(rel)
    assert not missing, f"docs/tests.md's table does not name {missing}"
