"""Ledger lines, atomic documents and sealed records survive kill -9 mid-write.

A child process (durability_writer.py) writes in a tight loop and acknowledges
each write on stdout once it returned; the parent SIGKILLs it at a seeded random
moment, a bounded number of rounds over the same state directory, then checks
what a restarted gateway would read:

- the ledger (written by `append`, and in batches by `submit` + `flush`): every line
  parses (at most the file's last line is torn), and every acknowledged line is there,
  through `JsonLinesLedger.read` too; an append after
  a torn last line closes the fragment off first (the last test pins that);
- the atomic document: always a complete JSON document, the last acknowledged
  one or the one being written after it;
- the records: every `*.json` is a complete sealed record, every acknowledged one
  is there, leftover temporary files are never read as records, and
  `RecordStore.passing_for` returns a whole record no older than the last acknowledged.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from durability_writer import BATCH_MAX, FINGERPRINT

from qualification.records import RecordStore
from service.ledger import JsonLinesLedger, write_json_atomic

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

ROUNDS = 12
SEED = 9_191
#: Kill this long after the child said it is ready (seeded uniform draw).
KILL_AFTER_S = (0.0, 0.3)


@dataclass
class Acks:
    ledger: list[tuple[int, int, str]] = field(default_factory=list)
    docs: list[tuple[int, int, str]] = field(default_factory=list)
    records: list[tuple[int, int, str]] = field(default_factory=list)


def _run_round(state: Path, round_: int, rng: random.Random, acks: Acks) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)])}
    child = subprocess.Popen(
        [sys.executable, str(HERE / "durability_writer.py"), str(state), str(round_), str(SEED + round_)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,  # unbuffered: readline() must not swallow acknowledgements that communicate() then misses
    )
    try:
        assert child.stdout is not None
        ready = child.stdout.readline()
        assert ready.startswith(b"ready"), ready + (child.stderr.read() if child.stderr else b"")
        time.sleep(rng.uniform(*KILL_AFTER_S))
    finally:
        child.send_signal(signal.SIGKILL)
        out, err = child.communicate(timeout=10)
    assert child.returncode == -signal.SIGKILL, err.decode(errors="replace")
    for line in out.decode().splitlines():
        kind, r, seq, value = line.split()
        target = {"ledger": acks.ledger, "doc": acks.docs, "record": acks.records}[kind]
        target.append((int(r), int(seq), value))


def _check_doc(state: Path, acks: Acks) -> None:
    """The document is whole, and it is the last acknowledged one or the next one."""
    path = state / "doc.json"
    if not acks.docs and not path.exists():
        return
    doc = json.loads(path.read_text(encoding="utf-8"))  # raises on a partial document
    assert set(doc) == {"round", "seq", "payload", "sha"}
    assert hashlib.sha256(doc["payload"].encode()).hexdigest() == doc["sha"]
    if acks.docs:
        last = acks.docs[-1]
        assert (doc["round"], doc["seq"]) >= last[:2], (
            f"document went back from {last[:2]} to {doc['round'], doc['seq']}"
        )
        if (doc["round"], doc["seq"]) == last[:2]:
            assert doc["sha"] == last[2]


def _check_records(state: Path, acks: Acks) -> RecordStore:
    store = RecordStore(state / "qualification")
    checks = store.all()
    bad = [(check.path.name, check.reason) for check in checks if not check.valid]
    assert not bad, f"half or broken records after kill -9: {bad}"
    names = {check.path.name for check in checks}
    missing = [qid for _, _, qid in acks.records if f"{qid}.json" not in names]
    assert not missing, f"acknowledged records missing: {missing}"
    leftovers = (
        [p for p in store.records_dir.iterdir() if not p.name.endswith(".json")] if store.records_dir.exists() else []
    )
    assert all(p.name.startswith(".") and p.name.endswith(".tmp") for p in leftovers), leftovers
    best, notes = store.passing_for(FINGERPRINT, policy="strict")
    assert not notes, notes
    if acks.records:
        assert best is not None
        assert best["seal"] and best["fingerprint"] == FINGERPRINT and best["verdict"]["passed"]
        newest_acked = json.loads((store.records_dir / f"{acks.records[-1][2]}.json").read_text())
        assert best["created_at"] >= newest_acked["created_at"]
        assert store.check(store.records_dir / f"{best['qualification_id']}.json").valid
    return store


def _check_ledger(path: Path, acks: list[tuple[int, int, str]]) -> int:
    """Checks one round's ledger file; returns the length of its torn tail (0: none)."""
    raw = path.read_bytes() if path.exists() else b""
    lines = raw.split(b"\n")
    complete, tail = lines[:-1], lines[-1]
    broken = []
    parsed: list[dict[str, object]] = []
    for number, line in enumerate(complete, 1):
        try:
            item = json.loads(line)
        except ValueError:
            broken.append((number, line[:60], len(line)))
            continue
        parsed.append(item)
        assert hashlib.sha256(str(item["payload"]).encode()).hexdigest() == item["sha"], f"line {number} corrupted"
    assert not broken, f"ledger lines that do not parse (not at the end of the file): {broken}"
    present = {(item["round"], item["seq"]) for item in parsed}
    assert len(present) == len(parsed), "a ledger line was written twice"
    missing = [(r, s) for r, s, _ in acks if (r, s) not in present]
    assert not missing, f"acknowledged ledger lines missing: {missing}"
    assert len(present) <= len(acks) + BATCH_MAX, "more lines than acknowledged writes plus those in flight"
    read_back = [(item["round"], item["seq"]) for item in JsonLinesLedger(path).read()]
    assert read_back == [(item["round"], item["seq"]) for item in parsed]
    return len(tail)


def test_writes_survive_kill_9(tmp_path: Path) -> None:
    state = tmp_path / "state"
    rng = random.Random(SEED)
    acks = Acks()
    torn_tails = 0
    started = time.monotonic()
    for round_ in range(ROUNDS):
        _run_round(state, round_, rng, acks)
        _check_doc(state, acks)
        _check_records(state, acks)
        path = state / "ledger" / f"round-{round_:03d}.jsonl"
        torn_tails += _check_ledger(path, [ack for ack in acks.ledger if ack[0] == round_]) > 0
    elapsed = time.monotonic() - started
    print(
        f"{ROUNDS} kills in {elapsed:.1f} s: {len(acks.ledger)} ledger, {len(acks.docs)} document and "
        f"{len(acks.records)} record writes acknowledged; {torn_tails} rounds ended on a torn ledger line"
    )
    assert acks.ledger and acks.docs and acks.records, "the rounds were too short to write anything"


# -- what a crash leaves behind, made deterministically --------------------------------------------


def test_leftover_temp_files_are_never_records(tmp_path: Path) -> None:
    """A writer killed between creating its temp file and renaming it leaves `.NAME.PID.TID.tmp` behind."""
    store = RecordStore(tmp_path / "qualification")
    body = {
        "qualification_id": "q-good",
        "created_at": "2026-01-01T00:00:00+00:00",
        "fingerprint": FINGERPRINT,
        "identity": {"gateway": "durability-test", "engine": {"model": "tiny", "max_model_len": 2048}},
        "verdict": {"result": "identical", "passed": True, "batched_result": "identical", "batched_passed": True},
    }
    good = store.write(body)
    whole = good.read_bytes()
    newer = json.loads(whole)
    newer.update(qualification_id="q-newer", created_at="2027-01-01T00:00:00+00:00")
    # Partial and even complete-looking temp files of a newer record, as a killed writer leaves them.
    (store.records_dir / ".q-newer.json.4242.1.tmp").write_bytes(json.dumps(newer).encode()[:100])
    (store.records_dir / ".q-newer.json.4243.1.tmp").write_text(json.dumps(newer))
    (store.records_dir / ".q-newer.json.4244.1.tmp").write_bytes(b"")
    assert [check.path.name for check in store.all()] == ["q-good.json"]
    best, notes = store.passing_for(FINGERPRINT, policy="strict")
    assert best is not None and best["qualification_id"] == "q-good" and not notes


@pytest.mark.parametrize("cut", [0, 1, 37, -2, -1])
def test_a_half_written_record_is_refused_not_returned(tmp_path: Path, cut: int) -> None:
    """Were a record ever cut short (not written atomically), the gate must refuse it, never half-read it."""
    store = RecordStore(tmp_path / "qualification")
    body = {
        "qualification_id": "q-whole",
        "created_at": "2026-01-01T00:00:00+00:00",
        "fingerprint": FINGERPRINT,
        "identity": {"gateway": "durability-test", "engine": {"model": "tiny", "max_model_len": 2048}},
        "verdict": {"result": "identical", "passed": True, "batched_result": "identical", "batched_passed": True},
    }
    store.write(body)
    half = store.write({**body, "qualification_id": "q-half", "created_at": "2027-01-01T00:00:00+00:00"})
    data = half.read_bytes()
    half.write_bytes(data[:cut] if cut >= 0 else data[: len(data) + cut])
    best, notes = store.passing_for(FINGERPRINT, policy="strict")
    assert best is not None and best["qualification_id"] == "q-whole"
    assert any(note.startswith("q-half.json") for note in notes), notes


def test_atomic_document_leaves_old_or_new(tmp_path: Path) -> None:
    """A stale temp file next to the document changes nothing a reader sees."""
    path = tmp_path / "evidence" / "doc.json"
    write_json_atomic(path, {"v": 1})
    (path.parent / f".{path.name}.999999.1.tmp").write_bytes(b'{"v": 2, "half')
    assert json.loads(path.read_text()) == {"v": 1}
    write_json_atomic(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 2}


def test_ledger_reader_skips_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    ledger = JsonLinesLedger(path)
    ledger.append({"seq": 0})
    ledger.append({"seq": 1})
    with open(path, "ab") as handle:
        handle.write(b'{"seq": 2, "payl')  # what a kill inside write() leaves
    assert [item["seq"] for item in ledger.read()] == [0, 1]


def test_an_append_after_a_torn_tail_is_still_read(tmp_path: Path) -> None:
    """The gateway restarts after a kill left a torn last line; the next acknowledged line must be readable."""
    path = tmp_path / "requests.jsonl"
    ledger = JsonLinesLedger(path)
    ledger.append({"seq": 0})
    with open(path, "ab") as handle:
        handle.write(b'{"seq": 1, "payl')
    ledger.append({"seq": 2})  # acknowledged: append returned
    assert [item["seq"] for item in ledger.read()] == [0, 2]
