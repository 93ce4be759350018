"""Durable append-only JSON-lines files and atomic JSON documents.

A ledger line is acknowledged only once it is on disk (written with one
`write` of a complete line, then fsync), so a crash leaves at most a missing
line, never a half one that a reader would take for a record. Documents
(qualification records, evidence bundles) are written to a temporary file,
fsynced and renamed into place, so a reader sees the old or the new file.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, document: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(document, ensure_ascii=False, indent=2, sort_keys=True).encode("utf-8")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _ends_torn(fd: int) -> bool:
    """True when the file is non-empty and its last byte is not a newline."""
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


class JsonLinesLedger:
    """One JSON object per line, appended durably; thread-safe within a process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def append(self, entry: dict[str, Any]) -> None:
        line = (json.dumps(entry, ensure_ascii=False, sort_keys=True, default=str) + "\n").encode("utf-8")
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if _ends_torn(fd):
                    # A writer killed mid-line left a fragment: close it off so this line stays whole.
                    line = b"\n" + line
                written = 0
                while written < len(line):
                    written += os.write(fd, line[written:])
                os.fsync(fd)
            finally:
                os.close(fd)

    def read(self) -> Iterator[dict[str, Any]]:
        """Complete, parseable lines only: a torn fragment (crash mid-write) is skipped."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as handle:
            for raw in handle:
                if not raw.endswith(b"\n"):
                    break
                try:
                    yield json.loads(raw)
                except ValueError:
                    continue
