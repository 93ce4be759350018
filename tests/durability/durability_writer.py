"""Child process of the durability tests: writes in a tight loop until it is killed.

    python durability_writer.py STATE_DIR ROUND SEED

Each iteration does one of four writes, chosen by a seeded generator, and only
after the write returned prints one acknowledgement line to stdout (flushed):

    ledger ROUND SEQ SHA        JsonLinesLedger.append of {"round", "seq", "payload", "sha"}
                                to STATE_DIR/ledger/round-ROUND.jsonl (one file per round: see
                                test_an_append_after_a_torn_tail_is_still_read for why)
    ledger ROUND SEQ SHA        (several) JsonLinesLedger.submit of up to BATCH_MAX such lines to the
                                same file, acknowledged each once flush() returned: the batched path
    doc ROUND SEQ SHA           write_json_atomic of the same shape to STATE_DIR/doc.json
    record ROUND SEQ QID        RecordStore.write of a passing record for FINGERPRINT

Line sizes vary from a few bytes to a few MiB so that a kill can land inside one
`write()` (the kernel stops a multi-page write at a fatal signal).
"""

from __future__ import annotations

import hashlib
import random
import string
import sys
from datetime import UTC, datetime
from pathlib import Path

from qualification.records import RecordStore, canonical_json
from service.ledger import JsonLinesLedger, write_json_atomic

IDENTITY = {"gateway": "durability-test", "engine": {"model": "tiny", "max_model_len": 2048}}
FINGERPRINT = hashlib.sha256(canonical_json(IDENTITY)).hexdigest()
SIZES = (16, 200, 4_000, 70_000, 1_000_000, 8_000_000)
#: Most lines submitted before one flush (their sizes stay under 70 kB each).
BATCH_MAX = 24


def entry(rng: random.Random, round_: int, seq: int, sizes: tuple[int, ...] = SIZES) -> dict[str, object]:
    size = rng.choice(sizes)
    payload = "".join(rng.choices(string.ascii_letters, k=min(size, 64))) * max(1, size // 64)
    return {"round": round_, "seq": seq, "payload": payload, "sha": hashlib.sha256(payload.encode()).hexdigest()}


def record_body(round_: int, seq: int) -> dict[str, object]:
    return {
        "qualification_id": f"q-{round_:03d}-{seq:06d}",
        "created_at": datetime.now(UTC).isoformat(),
        "fingerprint": FINGERPRINT,
        "identity": IDENTITY,
        "verdict": {"result": "identical", "passed": True, "batched_result": "identical", "batched_passed": True},
        "comparison": {"tokens": list(range(seq % 50)), "padding": "p" * (seq % 7 * 50_000)},
    }


def main() -> None:
    state_dir, round_, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    ledger = JsonLinesLedger(state_dir / "ledger" / f"round-{round_:03d}.jsonl")
    store = RecordStore(state_dir / "qualification")
    out = sys.stdout
    out.write(f"ready {round_}\n")
    out.flush()
    seq = 0
    while seq < 1_000_000:  # bounded; the parent kills it long before
        kind = rng.randrange(4)
        if kind == 3:
            batch = [entry(rng, round_, seq + index, SIZES[:4]) for index in range(rng.randint(2, BATCH_MAX))]
            for item in batch:
                ledger.submit(item)
            ledger.flush()
            for item in batch:
                out.write(f"ledger {round_} {item['seq']} {item['sha']}\n")
            out.flush()
            seq += len(batch)
            continue
        if kind == 0:
            item = entry(rng, round_, seq)
            ledger.append(item)
            out.write(f"ledger {round_} {seq} {item['sha']}\n")
        elif kind == 1:
            item = entry(rng, round_, seq)
            write_json_atomic(state_dir / "doc.json", item)
            out.write(f"doc {round_} {seq} {item['sha']}\n")
        else:
            body = record_body(round_, seq)
            store.write(body)
            out.write(f"record {round_} {seq} {body['qualification_id']}\n")
        out.flush()
        seq += 1


if __name__ == "__main__":
    main()
