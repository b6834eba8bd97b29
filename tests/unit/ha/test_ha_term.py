"""The epoch of a master term (common/ha/term.py): first term, restart, promote, copied epochs."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.ha import epochs as ep
from common.ha import term
from common.ha.epochs import EpochEntry as E

pytestmark = pytest.mark.unit


def test_first_term_starts_epoch_one_at_min_offset() -> None:
    assert term.master_term_history((), 0, 4096, 9000) == (E(1, 4096),)


def test_restarted_master_keeps_its_epoch() -> None:
    history = (E(1, 0), E(3, 500))
    assert (
        term.master_term_history(history, learned=1, min_phy_offset=0, max_phy_offset=900)
        == history
    )


def test_promoted_epoch_is_kept_not_doubled() -> None:
    # Broker.promote wrote (3, 700) after following epoch 2: the term runs in 3.
    history = (E(1, 0), E(2, 100), E(3, 700))
    assert term.master_term_history(history, 2, 0, 700) == history


def test_epoch_copied_from_another_master_gets_a_new_epoch() -> None:
    history = (E(1, 0), E(2, 100))
    assert term.master_term_history(history, 2, 0, 800) == (E(1, 0), E(2, 100), E(256, 800))


def test_log_shorter_than_the_last_epoch_never_reuses_its_number() -> None:
    history = (E(1, 0), E(2, 500))
    assert term.master_term_history(history, 0, 0, 400) == (E(1, 0), E(256, 400))


def test_begin_master_term_persists_and_slave_marker_forces_new_epoch(tmp_path: Path) -> None:
    assert term.begin_master_term(tmp_path, 0, 0) == (E(1, 0),)
    assert ep.load(tmp_path) == (E(1, 0),)
    assert term.begin_master_term(tmp_path, 0, 50) == (E(1, 0),)  # restart: same epoch
    term.record_learned_epoch(tmp_path, 1)  # as if a slave had copied epoch 1
    assert term.learned_epoch(tmp_path) == 1
    term.record_learned_epoch(tmp_path, 0)  # never lowered
    assert term.learned_epoch(tmp_path) == 1
    assert term.begin_master_term(tmp_path, 0, 80) == (E(1, 0), E(256, 80))
    assert ep.load(tmp_path) == (E(1, 0), E(256, 80))


def test_garbled_marker_counts_as_learned(tmp_path: Path) -> None:
    ep.save(tmp_path, (E(1, 0),))
    term.learned_epoch_path(tmp_path).write_bytes(b"\x00garbage")
    assert term.learned_epoch(tmp_path) is None
    assert term.begin_master_term(tmp_path, 0, 10) == (E(1, 0), E(256, 10))


def test_next_epoch_is_above_every_epoch_seen_and_names_the_broker() -> None:
    assert ep.next_epoch(1, 3) == 256 + 3
    assert ep.next_epoch(256 + 3, 1) == 512 + 1
    # two brokers promoted from the same history open different terms
    assert ep.next_epoch(259, 1) != ep.next_epoch(259, 2)
    assert min(ep.next_epoch(259, 1), ep.next_epoch(259, 2)) > 259
    with pytest.raises(ValueError):
        ep.next_epoch(1, 256)


def test_epochs_past_the_log_end_are_dropped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ep.save(tmp_path, (E(1, 0), E(257, 500)))
    with caplog.at_level("WARNING", logger="replog.term"):
        history = term.begin_master_term(tmp_path, 0, 400)  # the log ends before epoch 257
    assert E(257, 500) not in history
    assert "epochs_beyond_log_end_dropped" in caplog.text and "257@500" in caplog.text
