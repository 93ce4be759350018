"""One qualification at a time per state directory, and its progress where every process can read it.

With several front-end processes (service/frontends.py), `POST /admin/qualify`
lands on any of them and `GET /admin/qualify` (which `moss-gateway qualify`
polls) on any other. So the running job is claimed with an exclusive, non-
blocking `flock` on `qualification/job.lock`, held for the job's whole run (the
kernel releases it if the process dies), and its status is published to
`qualification/job.json` (written atomically) for whichever process answers the
poll. One process alone goes through the same board.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from service.ledger import write_json_atomic


class QualificationBoard:
    def __init__(self, root: Path) -> None:
        self.lock_path = root / "job.lock"
        self.status_path = root / "job.json"

    @contextlib.contextmanager
    def claim(self) -> Iterator[bool]:
        """Hold the job lock for the block; yields False (and holds nothing) when another job has it."""
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def is_claimed(self) -> bool:
        """Whether some process runs a qualification now (the lock is held)."""
        with self.claim() as free:
            return not free

    def publish(self, *, running: bool, progress: str | None, last: dict[str, Any] | None) -> None:
        write_json_atomic(self.status_path, {"running": running, "progress": progress, "last": last, "pid": os.getpid()})

    def read(self) -> dict[str, Any] | None:
        """The last published status, its `running` corrected by the lock (a job whose process died is not running)."""
        try:
            status: dict[str, Any] = json.loads(self.status_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if status.get("running"):
            status["running"] = self.is_claimed()
        return status
