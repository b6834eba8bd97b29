"""Epoch history: pure functions, the divergence point against a byte-level model, the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.ha import epochs as ep
from common.ha.epochs import EpochEntry as E
from common.ha.epochs import EpochFileError

pytestmark = pytest.mark.unit


# ---- pure functions --------------------------------------------------------------------------
def test_append_and_new_epoch_rules() -> None:
    h = ep.new_epoch((), 0)
    assert h == (E(1, 0),) and ep.last_epoch(h) == 1 and ep.last_epoch(()) == 0
    h = ep.new_epoch(h, 100)
    assert h == (E(1, 0), E(2, 100))
    assert ep.append_epoch(h, 7, 250) == (E(1, 0), E(2, 100), E(7, 250))
    with pytest.raises(ValueError, match="not newer"):
        ep.append_epoch(h, 2, 300)
    with pytest.raises(ValueError, match="starts before"):
        ep.append_epoch(h, 3, 99)
    with pytest.raises(ValueError, match="negative"):
        ep.append_epoch((), 1, -1)


def test_an_epoch_that_wrote_nothing_is_replaced_by_the_next_at_the_same_start() -> None:
    assert ep.new_epoch((E(1, 0), E(2, 100)), 100) == (E(1, 0), E(3, 100))
    assert ep.new_epoch((E(1, 0),), 0) == (E(2, 0),)


def test_validate() -> None:
    ep.validate((E(1, 0), E(2, 0 + 5), E(4, 5 + 1)))
    for bad in [(E(0, 0),), (E(1, -1),), (E(2, 0), E(2, 5)), (E(1, 10), E(2, 5))]:
        with pytest.raises(ValueError):
            ep.validate(bad)


def test_entry_index_and_end() -> None:
    h = (E(1, 10), E(2, 100), E(5, 300))
    assert [ep.entry_index_at(h, x) for x in (0, 9, 10, 99, 100, 299, 300, 10**9)] == [
        -1, -1, 0, 0, 1, 1, 2, 2]
    assert ep.entry_end(h, 0, 1000) == 100
    assert ep.entry_end(h, 2, 1000) == 1000
    assert ep.entry_end(h, 1, 250) == 250  # a log shorter than the history


def test_truncations() -> None:
    h = (E(1, 0), E(2, 100), E(3, 200))
    assert ep.truncate_from(h, 200) == (E(1, 0), E(2, 100))
    assert ep.truncate_from(h, 201) == h
    assert ep.truncate_from(h, 0) == ()
    assert ep.truncate_beyond(h, 200) == h  # a term that has not written yet stays
    assert ep.truncate_beyond(h, 199) == (E(1, 0), E(2, 100))


@pytest.mark.parametrize(
    ("local", "local_max", "remote", "remote_max", "expected"),
    [
        # identical histories: the shorter log is a prefix
        ([E(1, 0)], 500, [E(1, 0)], 800, 500),
        ([E(1, 0)], 800, [E(1, 0)], 500, 500),
        # old master rejoins: it kept writing epoch 1 past where epoch 2 began elsewhere
        ([E(1, 0)], 900, [E(1, 0), E(2, 600)], 1200, 600),
        # a slave that saw the start of epoch 2 only partially, master moved to epoch 3
        ([E(1, 0), E(2, 300)], 450, [E(1, 0), E(2, 300), E(3, 400)], 900, 400),
        # a slave behind in an older epoch of the master
        ([E(1, 0)], 200, [E(1, 0), E(2, 300), E(3, 400)], 900, 200),
        # divergent epoch 2 (split brain): back to the end of the common epoch 1
        ([E(1, 0), E(2, 300)], 700, [E(1, 0), E(3, 350)], 900, 300),
        # an epoch with no bytes on the local side
        ([E(1, 0), E(2, 300)], 300, [E(1, 0), E(3, 300)], 900, 300),
        # no common epoch, or nothing local: nothing provably equal
        ([E(2, 0)], 100, [E(3, 0)], 100, 0),
        ([], 0, [E(1, 0)], 100, 0),
        ([], 50, [E(1, 0)], 100, 0),
        # same epoch number, different start: not the same term
        ([E(1, 0), E(2, 40)], 100, [E(1, 0), E(2, 50)], 100, 40),
    ],
)
def test_find_divergence_cases(local: list[E], local_max: int, remote: list[E],
                               remote_max: int, expected: int) -> None:
    assert ep.find_divergence(tuple(local), local_max, tuple(remote), remote_max) == expected


@st.composite
def _logs(draw: st.DrawFn) -> list[tuple[tuple[E, ...], list[int]]]:
    """Logs (history, per-byte epoch labels) of terms that each start from a prefix of an
    earlier log (a slave promoted at its max offset) and write some bytes; plus slave copies
    holding a prefix of some log. Epoch numbers are unique per term, as in a real group."""
    logs: list[tuple[tuple[E, ...], list[int]]] = [((E(1, 0),), [1] * draw(st.integers(0, 6)))]
    for epoch in range(2, draw(st.integers(2, 7))):
        history, labels = logs[draw(st.integers(0, len(logs) - 1))]
        keep = draw(st.integers(0, len(labels)))
        base = ep.truncate_from(history, keep) if keep else ()
        written = draw(st.integers(0, 4))
        logs.append((ep.append_epoch(base, epoch, keep), labels[:keep] + [epoch] * written))
    for _ in range(draw(st.integers(0, 3))):
        history, labels = logs[draw(st.integers(0, len(logs) - 1))]
        keep = draw(st.integers(0, len(labels)))
        logs.append((ep.truncate_from(history, keep), labels[:keep]))
    return logs


@settings(max_examples=500, deadline=None)
@given(_logs(), st.data())
def test_find_divergence_is_the_common_prefix_of_the_byte_labels(
    logs: list[tuple[tuple[E, ...], list[int]]], data: st.DataObject
) -> None:
    (h1, l1), (h2, l2) = (data.draw(st.sampled_from(logs)) for _ in range(2))
    common = 0
    while common < min(len(l1), len(l2)) and l1[common] == l2[common]:
        common += 1
    assert ep.find_divergence(h1, len(l1), h2, len(l2)) == common


# ---- the file --------------------------------------------------------------------------------
def test_file_layout_is_rocketmq_checkpoint_text(tmp_path: Path) -> None:
    ep.save(tmp_path, (E(1, 0), E(2, 4096)))
    text = (tmp_path / "epochFileCheckpoint").read_text()
    lines = text.split("\n")
    assert lines[0] == "2" and lines[2:] == ["1-0", "2-4096", ""]
    assert int(lines[1]) == ep._crc("1-0\n2-4096\n") != 0


def test_save_load_round_trip_and_backup(tmp_path: Path) -> None:
    assert ep.load(tmp_path) == ()
    first = (E(1, 0),)
    second = (E(1, 0), E(2, 100))
    ep.save(tmp_path, first)
    assert not (tmp_path / "epochFileCheckpoint.bak").exists()
    ep.save(tmp_path, second)
    assert ep.load(tmp_path) == second
    assert ep.decode_file((tmp_path / "epochFileCheckpoint.bak").read_bytes()) == first
    assert not (tmp_path / "epochFileCheckpoint.tmp").exists()
    ep.save(tmp_path, ())
    assert ep.load(tmp_path) == ()


def test_restore_leaves_no_trace_of_the_undone_history(tmp_path: Path) -> None:
    """An undone promotion: neither the main file nor the backup keeps the undone epoch."""
    before = (E(1, 0),)
    ep.save(tmp_path, before)
    ep.save(tmp_path, (E(1, 0), E(258, 100)))
    ep.restore(tmp_path, before)
    assert ep.load(tmp_path) == before
    assert ep.decode_file((tmp_path / "epochFileCheckpoint.bak").read_bytes()) == before
    (tmp_path / "epochFileCheckpoint").write_bytes(b"garbage")  # the backup is what it was too
    assert ep.load(tmp_path) == before
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    ep.save(fresh, (E(257, 0),))
    ep.restore(fresh, ())  # there was no file: there is none again
    assert sorted(os.listdir(fresh)) == [] and ep.load(fresh) == ()


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[:-3],  # torn write
        lambda raw: raw.replace(b"2-100", b"2-101"),  # CRC mismatch
        lambda raw: b"3" + raw[1:],  # wrong count
        lambda raw: b"",
        lambda raw: b"\xff\xfe",
        lambda raw: raw.replace(b"2-100", b"2x100"),
    ],
)
def test_a_damaged_main_file_falls_back_to_the_backup(tmp_path: Path, damage,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    ep.save(tmp_path, (E(1, 0),))
    ep.save(tmp_path, (E(1, 0), E(2, 100)))
    main = tmp_path / "epochFileCheckpoint"
    main.write_bytes(damage(main.read_bytes()))
    with caplog.at_level("WARNING", logger="replog.epochs"):
        assert ep.load(tmp_path) == (E(1, 0),)
    assert "epoch_file_from_backup" in caplog.text  # not silently one save older


def test_crash_between_the_two_renames_leaves_the_backup(tmp_path: Path) -> None:
    ep.save(tmp_path, (E(1, 0),))
    ep.save(tmp_path, (E(1, 0), E(2, 100)))
    os.replace(tmp_path / "epochFileCheckpoint", tmp_path / "epochFileCheckpoint.bak")
    assert ep.load(tmp_path) == (E(1, 0), E(2, 100))


def test_no_valid_file_raises(tmp_path: Path) -> None:
    (tmp_path / "epochFileCheckpoint").write_bytes(b"1\n5\n1-0\n")
    with pytest.raises(EpochFileError, match="CRC"):
        ep.load(tmp_path)
    (tmp_path / "epochFileCheckpoint.bak").write_bytes(b"nonsense")
    with pytest.raises(EpochFileError, match="bak"):
        ep.load(tmp_path)


def test_zero_crc_is_not_checked_and_order_is(tmp_path: Path) -> None:
    assert ep.decode_file(b"2\n0\n1-0\n2-9\n") == (E(1, 0), E(2, 9))
    with pytest.raises(ValueError):
        ep.decode_file(b"2\n0\n2-0\n1-9\n")
    with pytest.raises(ValueError):
        ep.decode_file(b" 1\n0\n1-0\n")


def test_an_oversized_file_is_not_read_whole(tmp_path: Path) -> None:
    (tmp_path / "epochFileCheckpoint").write_bytes(b"1" * (ep.MAX_FILE_BYTES + 10))
    with pytest.raises(EpochFileError, match="larger than"):
        ep.load(tmp_path)


def test_save_refuses_an_invalid_history(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ep.save(tmp_path, (E(2, 0), E(1, 5)))
    assert not (tmp_path / "epochFileCheckpoint").exists()
