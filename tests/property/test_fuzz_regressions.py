"""The fuzz harnesses (``fuzz/``) without atheris: every corpus file, seeds and crashes kept,
replayed through its target's ``one_input``, then a short random pass of mutated corpus
files with a fixed seed. Where atheris is installed, each harness also runs coverage-guided
for a few hundred inputs (``make fuzz`` runs them for as long as it is given).
"""

from __future__ import annotations

import importlib
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.property

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from fuzz._harness import CORPUS_DIR, TOLERATE_ENV
from fuzz.make_corpus import TARGETS

SEED = int(os.environ.get("FUZZ_SEED", "58"))
MUTATIONS = 400  # per target
BUDGET_S = 4.0  # per target: the random pass stops there on a slow machine
INTERESTING = (0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF)


def _target(name: str) -> Callable[[bytes], None]:
    os.environ.pop(TOLERATE_ENV, None)  # every finding raises here
    return importlib.import_module(f"fuzz.{name}").one_input  # type: ignore[no-any-return]


def _corpus(name: str) -> list[Path]:
    return sorted(p for p in (CORPUS_DIR / name).iterdir() if p.is_file())


CASES = [(name, path.name) for name in TARGETS for path in _corpus(name)]


def test_every_target_has_a_corpus() -> None:
    for name in TARGETS:
        assert _corpus(name), name
    size = sum(p.stat().st_size for name in TARGETS for p in _corpus(name))
    assert size < 512 * 1024, f"the corpora hold {size} bytes: keep them small"


@pytest.mark.parametrize(("name", "case"), CASES, ids=[f"{n}/{c}" for n, c in CASES])
def test_a_corpus_file_replays(name: str, case: str) -> None:
    _target(name)((CORPUS_DIR / name / case).read_bytes())


def _mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """libFuzzer's simplest mutations: flip, insert, erase, set, splice."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        at = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[at % len(out)] ^= 1 << rng.randrange(8)
        elif op == 1:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        elif op == 2:
            del out[at:at + rng.randint(1, 16)]
        elif op == 3 and out:
            out[at % len(out)] = rng.choice(INTERESTING)
        else:
            other = rng.choice(pool)
            cut = rng.randrange(len(other) + 1)
            out[at:] = other[cut:]
    return bytes(out)


@pytest.mark.parametrize("name", TARGETS)
def test_a_random_pass_finds_nothing(name: str) -> None:
    one_input = _target(name)
    pool = [p.read_bytes() for p in _corpus(name)]
    rng = random.Random(f"{SEED}-{name}")
    deadline = time.monotonic() + BUDGET_S
    for i in range(MUTATIONS):
        if time.monotonic() > deadline:
            break
        data = _mutate(rng, rng.choice(pool), pool)
        try:
            one_input(data)
        except BaseException as e:
            raise AssertionError(f"mutation {i} (seed {SEED}) found {e!r}; input {data!r}") \
                from e


@pytest.mark.slow
@pytest.mark.parametrize("name", TARGETS)
def test_a_coverage_guided_pass_finds_nothing(name: str, tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    env = {k: v for k, v in os.environ.items() if k != TOLERATE_ENV}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "fuzz" / f"{name}.py"), "-runs=500", f"-seed={SEED}",
         f"-artifact_prefix={tmp_path}/", str(tmp_path), str(CORPUS_DIR / name)],
        check=False, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(tmp_path.glob("crash-*"))
