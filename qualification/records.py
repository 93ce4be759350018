"""Qualification records: one verdict bound to one backend identity.

Records are JSON documents written atomically into the ledger directory and
sealed with an HMAC whose key lives only in the gateway's state directory, so a
record that was edited, or written by anyone without the key, does not open the
gate. Records survive restarts; the gate reads them at start-up.
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

    def __init__(self, root: Path) -> None:
        self.root = root
        self.records_dir = root / "records"
        self.key_path = root / "record.key"

    def _key(self) -> bytes:
        """The sealing key, created once (0600) and never leaving the state directory."""
        if not self.key_path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            key = secrets.token_bytes(32)
            tmp = self.key_path.with_name(f".record.key.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, key.hex().encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, self.key_path)  # first writer wins if two processes race
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        return bytes.fromhex(self.key_path.read_text().strip())

    def seal(self, body: dict[str, Any]) -> str:
        return hmac.new(self._key(), canonical_json(body), hashlib.sha256).hexdigest()

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
        body = {k: v for k, v in record.items() if k != "seal"}
        if not hmac.compare_digest(str(record["seal"]), self.seal(body)):
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
            if best is None or str(record.get("created_at", "")) > str(best.get("created_at", "")):
                best = record
        return best, notes
