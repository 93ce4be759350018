"""Sealed qualification records: written atomically, refused when altered or foreign."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from qualification.records import RecordKeyError, RecordStore, canonical_json
from service.app import create_app
from service.gate import record_store_for
from service.settings import GatewaySettings

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


# -- the sealing key ------------------------------------------------------------


def write_key(path: Path, text: str, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("text", "mode", "says"),
    [
        ("", 0o600, "is empty"),
        ("  \n", 0o600, "is empty"),
        ("ab" * 16, 0o600, "holds 16 bytes"),
        ("zz" * 32, 0o600, "not hex"),
        ("ab" * 32, 0o644, "mode 0644"),
        ("ab" * 32, 0o640, "mode 0640"),
        ("ab" * 32, 0o602, "mode 0602"),
    ],
)
def test_an_untrusted_key_is_refused(tmp_path: Path, text: str, mode: int, says: str) -> None:
    write_key(tmp_path / "record.key", text, mode)
    with pytest.raises(RecordKeyError, match=says):
        RecordStore(tmp_path)


def test_a_32_byte_private_key_is_used(tmp_path: Path) -> None:
    key = write_key(tmp_path / "record.key", "cd" * 32, 0o400)
    store = RecordStore(tmp_path)
    store.write(record())
    assert store.passing_for(FINGERPRINT, policy="explainable")[0] is not None
    assert key.read_text() == "cd" * 32  # used as given, not replaced


def test_the_key_can_live_outside_the_state_dir(tmp_path: Path) -> None:
    secret = tmp_path / "secrets" / "moss-record.key"
    store = RecordStore(tmp_path / "state", key_path=secret)
    store.write(record())
    assert secret.stat().st_mode & 0o777 == 0o600  # generated there, private
    assert not (tmp_path / "state" / "record.key").exists()
    assert RecordStore(tmp_path / "state", key_path=secret).passing_for(FINGERPRINT, policy="explainable")[0]
    # Without that key (the state dir's own, newly generated) the same records do not open the gate.
    assert RecordStore(tmp_path / "state").passing_for(FINGERPRINT, policy="explainable")[0] is None


def test_settings_and_environment_name_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = write_key(tmp_path / "elsewhere.key", "ef" * 32)
    monkeypatch.setenv("MOSS_GATEWAY_QUALIFICATION__RECORD_KEY_PATH", str(secret))
    settings = GatewaySettings(state_dir=tmp_path / "state")
    assert record_store_for(settings).key_path == secret


def test_the_gateway_refuses_to_start_on_an_empty_key(tmp_path: Path) -> None:
    key = write_key(tmp_path / "k", "")
    settings = GatewaySettings(state_dir=tmp_path / "state", qualification={"record_key_path": key})
    with pytest.raises(RecordKeyError, match="is empty"):
        create_app(settings)


def test_a_verified_document_comes_back_and_an_altered_one_does_not(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    sealed = store.sealed({"token_ids": [1, 2, 3]})
    assert store.verify(sealed) == {"token_ids": [1, 2, 3]}
    assert store.verify({**sealed, "token_ids": [1, 2, 4]}) is None
    assert store.verify({"token_ids": [1, 2, 3]}) is None
