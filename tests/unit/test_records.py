"""Sealed qualification records: written atomically, refused when altered or foreign."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from qualification.records import RecordStore, canonical_json

IDENTITY = {"engine": {"dtype": "float32"}, "checkpoint": {"weights": {"m.safetensors": "abc"}}}
FINGERPRINT = hashlib.sha256(canonical_json(IDENTITY)).hexdigest()  # spelled out: what fingerprint_of must give


def record(result="identical", passed=True, batched=True, fingerprint=FINGERPRINT, qid="q-1", created="2026-11-30T00:00:00"):
    return {
        "qualification_id": qid, "created_at": created, "fingerprint": fingerprint, "identity": IDENTITY,
        "verdict": {"result": result, "passed": passed, "batched_result": result, "batched_passed": batched},
    }


def test_written_record_opens_for_its_fingerprint(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write(record())
    found, notes = store.passing_for(FINGERPRINT, policy="explainable")
    assert found is not None and found["qualification_id"] == "q-1"
    assert notes == []
    assert (tmp_path / "record.key").stat().st_mode & 0o777 == 0o600


def test_other_fingerprint_does_not_open(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write(record())
    assert store.passing_for("0" * 64, policy="explainable")[0] is None


def test_altered_record_is_refused(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    path = store.write(record(result="failed", passed=False, batched=False))
    document = json.loads(path.read_text())
    document["verdict"].update(result="identical", passed=True, batched_passed=True)
    path.write_text(json.dumps(document))
    found, notes = store.passing_for(FINGERPRINT, policy="explainable")
    assert found is None
    assert any("seal mismatch" in note for note in notes)


def test_record_sealed_elsewhere_is_refused(tmp_path: Path) -> None:
    foreign = RecordStore(tmp_path / "other")
    path = foreign.write(record())
    store = RecordStore(tmp_path / "mine")
    store.records_dir.mkdir(parents=True)
    (store.records_dir / path.name).write_text(path.read_text())
    assert store.passing_for(FINGERPRINT, policy="explainable")[0] is None


def test_identity_must_hash_to_the_fingerprint(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write(record(fingerprint="f" * 64))
    assert store.passing_for("f" * 64, policy="explainable")[0] is None


def test_policy_and_batched_verdict_are_enforced(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write(record(result="explained", qid="q-explained"))
    assert store.passing_for(FINGERPRINT, policy="explainable")[0]["qualification_id"] == "q-explained"
    assert store.passing_for(FINGERPRINT, policy="strict")[0] is None
    other = RecordStore(tmp_path / "b")
    other.write(record(batched=False))
    assert other.passing_for(FINGERPRINT, policy="explainable")[0] is None


def test_newest_passing_record_wins(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write(record(qid="q-old", created="2026-11-29T00:00:00"))
    store.write(record(qid="q-new", created="2026-11-30T00:00:00"))
    assert store.passing_for(FINGERPRINT, policy="explainable")[0]["qualification_id"] == "q-new"


def test_fingerprint_is_the_sha256_of_the_canonical_identity() -> None:
    from qualification.records import fingerprint_of

    assert fingerprint_of(IDENTITY) == FINGERPRINT
    assert fingerprint_of({**IDENTITY, "engine": {"dtype": "bfloat16"}}) != FINGERPRINT
