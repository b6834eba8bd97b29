"""The ``replog`` command line (``common/cli/main.py``); ``python -m common.cli`` runs it."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """``replog``'s entry point, kept here too for scripts that call ``common.cli:main``."""
    from common.cli.main import main as run

    return run(argv)
