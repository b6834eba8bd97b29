"""After pytest died of a signal: the test it was running and the stack of the thread that
crashed, in a few lines (``tests/conftest.py`` wrote both; ``make test`` calls this).

    python tests/fatal_report.py STATUS [STATE_DIR]
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

FRAMES = 12  # innermost frames shown; the whole dump stays in the file


def crashed_thread(dump: str) -> list[str]:
    """The 'Current thread' section of a faulthandler dump, innermost frames first."""
    lines = dump.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Current thread"):
            section = [line]
            for frame in lines[i + 1 :]:
                if not frame.strip():
                    break
                section.append(frame)
            return section
    return []


def report(status: int, state: Path) -> str:
    sig = status - 128
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    current = state / "test-current"
    test = current.read_text(encoding="utf-8").strip() if current.exists() else "(none started)"
    out = [f"pytest died of {name} (status {status}) while running {test}"]
    dump_path = state / "test-fatal.log"
    dump = dump_path.read_text(encoding="utf-8", errors="replace") if dump_path.exists() else ""
    first = next((line for line in dump.splitlines() if line.startswith("Fatal Python")), None)
    if first:
        out.append(first)
    section = crashed_thread(dump)
    if section:
        out.append(section[0])
        out.extend(section[1 : FRAMES + 1])
        if len(section) > FRAMES + 1:
            out.append(f"  ... {len(section) - FRAMES - 1} outer frames")
    out.append(f"every thread's stack: {dump_path}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    status = int(argv[1])
    state = Path(argv[2]) if len(argv) > 2 else Path(__file__).resolve().parents[1] / "build"
    print(report(status, state), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
