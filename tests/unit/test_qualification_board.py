"""One qualification at a time per state directory, and its status readable by every process."""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Event
from pathlib import Path

from service.qualification_board import QualificationBoard

SPAWN = multiprocessing.get_context("spawn")


def claim_and_hold(root: Path, claimed: Event, release: Event) -> None:
    board = QualificationBoard(root)
    with board.claim() as mine:
        assert mine
        board.publish(running=True, progress="reference: running", last=None)
        claimed.set()
        release.wait(30)


def test_a_claim_held_by_another_process_refuses_this_one_and_shows_its_progress(tmp_path: Path) -> None:
    claimed, release = SPAWN.Event(), SPAWN.Event()
    process = SPAWN.Process(target=claim_and_hold, args=(tmp_path, claimed, release))
    process.start()
    try:
        assert claimed.wait(30)
        board = QualificationBoard(tmp_path)
        assert board.is_claimed()
        with board.claim() as mine:
            assert mine is False
        status = board.read()
        assert status is not None and status["running"] is True and status["progress"] == "reference: running"
    finally:
        release.set()
        process.join(30)
    assert not board.is_claimed()
    with board.claim() as mine:
        assert mine is True


def test_a_job_whose_process_died_is_not_running(tmp_path: Path) -> None:
    """The status file still says running, but nobody holds the lock: the kernel released it with the process."""
    claimed, release = SPAWN.Event(), SPAWN.Event()
    process = SPAWN.Process(target=claim_and_hold, args=(tmp_path, claimed, release))
    process.start()
    assert claimed.wait(30)
    process.kill()
    process.join(30)
    status = QualificationBoard(tmp_path).read()
    assert status is not None and status["running"] is False and status["progress"] == "reference: running"


def test_no_status_before_any_job(tmp_path: Path) -> None:
    assert QualificationBoard(tmp_path).read() is None
