"""What the fuzz harnesses share: a byte reader for the inputs, the open findings a long run
may be told to tolerate, and the entry point that runs a target under atheris.

Each harness in this folder has ``one_input(data: bytes)``, which raises on a finding (a crash,
an exception the target may not raise, a differential mismatch) and returns otherwise, and a
``main()`` that fuzzes it. ``tests/property/test_fuzz_regressions.py`` replays every file of
``fuzz/corpus/<name>/`` through ``one_input`` without atheris.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

FUZZ_DIR = Path(__file__).resolve().parent
CORPUS_DIR = FUZZ_DIR / "corpus"
WORK_DIR = FUZZ_DIR.parent / ".fuzz-work"  # what a run adds to a corpus: kept out of the tree
TOLERATE_ENV = "FUZZ_TOLERATE"  # open findings (by name, comma separated) a run steps over

_noted: set[str] = set()


def tolerated(finding: str) -> bool:
    """Whether the run was told to step over the open finding ``finding`` (reported once on
    stderr): so a long run explores past a bug another change fixes. Never in the tests."""
    if finding not in os.environ.get(TOLERATE_ENV, "").split(","):
        return False
    if finding not in _noted:
        _noted.add(finding)
        print(f"[fuzz] open finding {finding!r} seen: stepped over ({TOLERATE_ENV})",
              file=sys.stderr)
    return True


class Reader:
    """Reads an input's bytes as the harness's choices; past the end every read is zero."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def int(self, size: int) -> int:
        raw = self.take(size)
        return int.from_bytes(raw.ljust(size, b"\x00"), "big")

    def take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out

    def rest(self) -> bytes:
        out = self.data[self.pos:]
        self.pos = len(self.data)
        return out

    def frames(self, most: int = 64) -> list[bytes]:
        """The rest as length-prefixed frames (2 bytes big-endian, then the frame)."""
        out: list[bytes] = []
        while self.pos < len(self.data) and len(out) < most:
            out.append(self.take(self.int(2)))
        return out


def pack_frames(frames: list[bytes]) -> bytes:
    """``Reader.frames``'s inverse, for the seed corpora."""
    return b"".join(len(f).to_bytes(2, "big") + f for f in frames)


def write_corpus(name: str, seeds: list[bytes]) -> None:
    """The seed corpus of target ``name``: one file per distinct seed not already kept under
    another name, named by its index."""
    out = CORPUS_DIR / name
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("seed-*"):
        old.unlink()
    seen = {p.read_bytes() for p in out.iterdir()}  # crash and finding cases already kept
    for i, seed in enumerate(seeds):
        if seed not in seen:
            seen.add(seed)
            (out / f"seed-{i:04d}").write_bytes(seed)


def instrumented(module_name: str) -> Any:
    """The context to import a harness's targets in: atheris's instrumentation of replog's
    own modules (``common``) when the harness runs as a fuzzer, else nothing (the tests)."""
    if module_name != "__main__":
        return contextlib.nullcontext()
    import atheris

    return atheris.instrument_imports(include=["common"])


def run(name: str, one_input: Callable[[bytes], None]) -> None:
    """Fuzz ``one_input`` with atheris: libFuzzer's flags from the command line; the seed
    corpus is ``fuzz/corpus/<name>/``, new inputs go to ``.fuzz-work/<name>/`` and a crash
    to ``fuzz/corpus/<name>/crash-*`` (a regression case from then on)."""
    import atheris

    args = list(sys.argv)
    if not any(not a.startswith("-") for a in args[1:]):  # no corpus named: ours
        work = WORK_DIR / name
        work.mkdir(parents=True, exist_ok=True)
        args += [str(work), str(CORPUS_DIR / name)]
    if not any(a.startswith("-artifact_prefix=") for a in args):
        args.append(f"-artifact_prefix={CORPUS_DIR / name}/")
    atheris.Setup(args, atheris.instrument_func(one_input))
    atheris.Fuzz()


def clean_work(name: str) -> None:
    shutil.rmtree(WORK_DIR / name, ignore_errors=True)
