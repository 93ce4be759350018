"""Qualification records: one verdict bound to one backend identity.

Records are JSON documents written atomically into the ledger directory and
sealed with an HMAC, so a record that was edited, or written by anyone without
the key, does not open the gate. Records survive restarts; the gate reads them
at start-up. The same seal protects the cached reference runs.

The key is the gate's whole trust: by default `record.key` beside the records
(created 0600 on first use), or a file outside the state directory
(`qualification.record_key_path`, e.g. a mounted secret) so that whoever can
write the records cannot also read the key. A key file that is empty, shorter
than 32 bytes, not hex, or readable by group or others is refused with an error
that says what to do: an empty key would make the HMAC a checksum anyone can
compute, and a readable one lets any local user forge records.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.ledger import write_json_atomic

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1

#: Shortest accepted sealing key, in bytes (the key file holds it as hex).
MIN_KEY_BYTES = 32


class RecordKeyError(RuntimeError):
    """The sealing key file cannot be trusted (empty, short, not hex, or readable by others)."""


def canonical_json(document: Any) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def fingerprint_of(identity: Any) -> str:
    """The name of a backend identity: SHA-256 of its canonical JSON."""
    return hashlib.sha256(canonical_json(identity)).hexdigest()


@dataclass(frozen=True)
class RecordCheck:
    path: Path
    record: dict[str, Any] | None
    valid: bool
    reason: str


class RecordStore:
    """The ledger directory of qualification records."""

    def __init__(self, root: Path, *, key_path: Path | None = None) -> None:
        """Open the store; the key is created if missing and checked now (`RecordKeyError`)."""
        self.root = root
        self.records_dir = root / "records"
        self.key_path = key_path or root / "record.key"
        self._sealing_key = load_or_create_key(self.key_path)

    def seal(self, body: dict[str, Any]) -> str:
        return hmac.new(self._sealing_key, canonical_json(body), hashlib.sha256).hexdigest()

    def sealed(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` with its seal, as `verify` expects it."""
        return {**body, "seal": self.seal(body)}

    def verify(self, document: Any) -> dict[str, Any] | None:
        """The body of a sealed document, or None when it is not one sealed with this key."""
        if not isinstance(document, dict) or "seal" not in document:
            return None
        body = {k: v for k, v in document.items() if k != "seal"}
        return body if hmac.compare_digest(str(document["seal"]), self.seal(body)) else None

    def write(self, body: dict[str, Any]) -> Path:
        """Seal and store a record; returns its path."""
        record = {**body, "schema": SCHEMA_VERSION}
        record["seal"] = self.seal(record)
        path = self.records_dir / f"{record['qualification_id']}.json"
        write_json_atomic(path, record)
        return path

    def check(self, path: Path) -> RecordCheck:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return RecordCheck(path, None, False, f"unreadable: {exc}")
        if not isinstance(record, dict) or "seal" not in record:
            return RecordCheck(path, None, False, "not a sealed record")
        if self.verify(record) is None:
            return RecordCheck(path, record, False, "seal mismatch: the record was altered or not written here")
        if record.get("schema") != SCHEMA_VERSION:
            return RecordCheck(path, record, False, f"unknown schema {record.get('schema')!r}")
        return RecordCheck(path, record, True, "sealed")

    def all(self) -> list[RecordCheck]:
        if not self.records_dir.exists():
            return []
        return [self.check(path) for path in sorted(self.records_dir.glob("*.json"))]

    def passing_for(self, fingerprint: str, *, policy: str) -> tuple[dict[str, Any] | None, list[str]]:
        """The newest valid passing record for this fingerprint under this policy, and why others were refused."""
        notes: list[str] = []
        best: dict[str, Any] | None = None
        for check in self.all():
            if not check.valid or check.record is None:
                notes.append(f"{check.path.name}: {check.reason}")
                logger.warning("qualification record %s refused: %s", check.path.name, check.reason)
                continue
            record = check.record
            if record.get("fingerprint") != fingerprint:
                continue
            if fingerprint_of(record.get("identity")) != fingerprint:
                notes.append(f"{check.path.name}: identity does not hash to its fingerprint")
                continue
            verdict = record.get("verdict", {})
            accepted = verdict.get("result") == "identical" or (
                verdict.get("result") == "explained" and policy == "explainable"
            )
            if not (verdict.get("passed") and accepted and verdict.get("batched_passed", False)):
                notes.append(f"{check.path.name}: verdict {verdict.get('result')} does not pass policy {policy}")
                continue
            unqualified_ranks = ranks_not_passing(record)
            if unqualified_ranks:
                notes.append(f"{check.path.name}: data-parallel rank(s) {unqualified_ranks} not qualified")
                continue
            if best is None or str(record.get("created_at", "")) > str(best.get("created_at", "")):
                best = record
        return best, notes


def ranks_not_passing(record: dict[str, Any]) -> list[int]:
    """The data-parallel ranks of the record's engine without a passing verdict of their own.

    A record for `data_parallel_size` N must hold N per-rank results, each passing
    alone and in a batch: the engine may place any request on any rank.
    """
    size = int(((record.get("identity") or {}).get("engine") or {}).get("data_parallel_size") or 1)
    if size <= 1:
        return []
    verdicts = {entry.get("rank"): entry.get("verdict", {}) for entry in record.get("ranks") or []}
    return [
        rank for rank in range(size)
        if not (verdicts.get(rank, {}).get("passed") and verdicts.get(rank, {}).get("batched_passed"))
    ]


def load_or_create_key(path: Path) -> bytes:
    """The sealing key at `path`: created (32 random bytes as hex, 0600) if missing, else checked.

    Refused (`RecordKeyError`): a file readable or writable by group or others, an
    empty file, text that is not hex, or fewer than `MIN_KEY_BYTES` bytes.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, secrets.token_bytes(MIN_KEY_BYTES).hex().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # first writer wins if two processes race
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordKeyError(f"the qualification record key {path} cannot be read: {exc}") from exc
    if mode & 0o077:
        raise RecordKeyError(
            f"the qualification record key {path} has mode {mode:04o}: group or others can read or write it, so "
            f"anyone on this machine could forge qualification records; run `chmod 600 {path}`"
        )
    if not text:
        raise RecordKeyError(
            f"the qualification record key {path} is empty (an HMAC with an empty key proves nothing); delete it "
            f"to have one generated, or write {MIN_KEY_BYTES} random bytes as hex (`openssl rand -hex {MIN_KEY_BYTES}`)"
        )
    try:
        key = bytes.fromhex(text)
    except ValueError as exc:
        raise RecordKeyError(f"the qualification record key {path} is not hex text") from exc
    if len(key) < MIN_KEY_BYTES:
        raise RecordKeyError(
            f"the qualification record key {path} holds {len(key)} bytes; at least {MIN_KEY_BYTES} are needed "
            f"(`openssl rand -hex {MIN_KEY_BYTES}`)"
        )
    return key
