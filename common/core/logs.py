"""Structured logging: one line per event, ``event=name key=value ...``."""

from __future__ import annotations

import logging
from typing import Any


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """One structured line per event: ``event=name key=value ...`` (values quoted if needed)."""
    if not logger.isEnabledFor(level):
        return
    parts = [f"event={event}"]
    for key, value in fields.items():
        text = str(value)
        if not text or any(c in text for c in ' "='):
            text = '"' + text.replace('"', '\\"') + '"'
        parts.append(f"{key}={text}")
    logger.log(level, " ".join(parts))

