"""Durable append-only JSON-lines files and atomic JSON documents.

A ledger line is acknowledged only once it is on disk (written with one
`write` of complete lines, then fsync), so a crash leaves at most a missing
line, never a half one that a reader would take for a record. Documents
(qualification records, evidence bundles) are written to a temporary file,
fsynced and renamed into place, so a reader sees the old or the new file.

Two ways to write a line:

- `append(line)` writes and fsyncs before it returns: for tools, tests and
  threads that may block.
- `submit(line)` never blocks on the disk: it queues the line for one writer
  thread, which writes every queued line with one `write` and one fsync
  (a batch), so that the event loop never waits for a disk and a burst of
  requests costs one fsync, not one each. `flush()` waits until every line
  submitted so far is on disk; `close()` flushes and stops the writer, and the
  app's shutdown calls it, so a clean stop loses no accepted line. A kill -9
  loses at most the lines still queued (never more than `max_queued`).

The ASGI layer that writes one line per answered request (service/app.py)
marks the request it is watching (`watch_request`); `append` and `submit`
called while that request is being served note that the request has its line,
so the layer does not write a second one.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


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


def _make_dirs_durably(directory: Path) -> None:
    """Create `directory` and its missing parents, fsyncing each parent so the new entries survive a crash."""
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir()
        _fsync_dir(path.parent)


@dataclass
class WatchedRequest:
    """One request the ledger's ASGI layer watches: its id, and how many lines were written for it."""

    request_id: str
    lines: int = 0


_watched: contextvars.ContextVar[WatchedRequest | None] = contextvars.ContextVar("moss_ledger_request", default=None)


@contextlib.contextmanager
def watch_request(request_id: str) -> Iterator[WatchedRequest]:
    """Serve one request under this context; the lines written for it meanwhile are counted on the yielded object.

    Context variables follow the request into the tasks and worker threads it
    starts (`asyncio.create_task`, `asyncio.to_thread`), so a line written from
    any of them counts.
    """
    watched = WatchedRequest(request_id)
    token = _watched.set(watched)
    try:
        yield watched
    finally:
        _watched.reset(token)


def current_request_id() -> str | None:
    """The id the ledger layer gave the request being served (None outside one)."""
    watched = _watched.get()
    return None if watched is None else watched.request_id


def _note_line_for_current_request() -> None:
    watched = _watched.get()
    if watched is not None:
        watched.lines += 1


def _encode(entry: dict[str, Any]) -> bytes:
    return (json.dumps(entry, ensure_ascii=False, sort_keys=True, default=str) + "\n").encode("utf-8")


#: Default bound of `submit`'s queue: lines waiting for the writer thread.
DEFAULT_MAX_QUEUED = 10_000
#: Most lines one batch writes (one `write`, one fsync).
MAX_BATCH_LINES = 512


class JsonLinesLedger:
    """One JSON object per line, appended durably; thread-safe within a process.

    The writer thread starts with the first `submit`, so a ledger that is only
    read or appended to synchronously (tools, the kill -9 tests) holds no thread.
    """

    def __init__(self, path: Path, *, max_queued: int = DEFAULT_MAX_QUEUED) -> None:
        self.path = path
        self.max_queued = max_queued
        #: Serialises writers of the file (the writer thread and `append`), so lines never interleave.
        self._file_lock = threading.Lock()
        #: Guards the writer's start and stop against a concurrent `submit`.
        self._state_lock = threading.Lock()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=max_queued)
        self._writer: threading.Thread | None = None
        self._closed = False
        #: Lines handed to `submit` and lines the writer finished with (written or failed), for `flush`.
        self._submitted = 0
        self._done = 0
        self._progress = threading.Condition()
        #: Lines the writer could not write (disk full, ...): logged and counted, never silently dropped.
        self.failed_lines = 0
        #: Lines `submit` wrote itself because the queue was full or the ledger closed.
        self.written_inline = 0

    # -- synchronous ---------------------------------------------------------------------------------
    def append(self, entry: dict[str, Any]) -> None:
        """Write one line and fsync it before returning (blocks: not for the event loop)."""
        _note_line_for_current_request()
        self._write([_encode(entry)])

    def _open(self) -> int:
        """The ledger file for appending; a new file's directory entry is fsynced before any line counts."""
        try:
            return os.open(self.path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            pass
        _make_dirs_durably(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            _fsync_dir(self.path.parent)
        except OSError:
            os.close(fd)
            raise
        return fd

    def _write(self, lines: list[bytes]) -> None:
        """One `write` of complete lines, then one fsync."""
        data = b"".join(lines)
        with self._file_lock:
            fd = self._open()
            try:
                if _ends_torn(fd):
                    # A writer killed mid-line left a fragment: close it off so these lines stay whole.
                    data = b"\n" + data
                written = 0
                while written < len(data):
                    written += os.write(fd, data[written:])
                os.fsync(fd)
            finally:
                os.close(fd)

    # -- batched, off the caller's thread ----------------------------------------------------------
    def submit(self, entry: dict[str, Any]) -> None:
        """Queue one line for the writer thread; returns at once (safe on the event loop).

        When the queue is full (the disk is `max_queued` lines behind) or the
        ledger is closed, the line is written here instead, synchronously: the
        caller slows down to the disk's pace rather than lose an accepted line.
        """
        _note_line_for_current_request()
        line = _encode(entry)
        with self._state_lock:
            if not self._closed:
                if self._writer is None:
                    self._writer = threading.Thread(target=self._run_writer, name="ledger-writer", daemon=True)
                    self._writer.start()
                try:
                    self._queue.put_nowait(line)
                except queue.Full:
                    pass
                else:
                    with self._progress:
                        self._submitted += 1
                    return
        self.written_inline += 1
        self._write([line])

    def _run_writer(self) -> None:
        """Take what is queued (up to MAX_BATCH_LINES), write it with one fsync, repeat until the stop mark."""
        stopping = False
        while not stopping:
            batch: list[bytes] = []
            item = self._queue.get()
            while True:
                if item is None:
                    stopping = True
                else:
                    batch.append(item)
                if len(batch) >= MAX_BATCH_LINES:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                try:
                    self._write(batch)
                except OSError:
                    self.failed_lines += len(batch)
                    logger.exception("could not write %d ledger lines to %s", len(batch), self.path)
                with self._progress:
                    self._done += len(batch)
                    self._progress.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every line submitted before this call is written; False if `timeout` ran out first."""
        with self._progress:
            target = self._submitted
            return self._progress.wait_for(lambda: self._done >= target, timeout=timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Write what is queued, stop the writer; later `submit`s write inline. False if `timeout` ran out."""
        with self._state_lock:
            self._closed = True
            writer = self._writer
            if writer is not None:
                self._queue.put(None)  # after every accepted line: the writer drains them first
        if writer is None:
            return True
        writer.join(timeout)
        return not writer.is_alive()

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
