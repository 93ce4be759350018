"""A front end's gate follows the records another process writes or removes (service/gate.py `refresh_gate`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from qualification.records import canonical_json
from service.admission import AdmissionController, LocalSlots
from service.gate import record_store, refresh_gate
from service.ledger import JsonLinesLedger
from service.metrics import GatewayMetrics
from service.settings import GatewaySettings
from service.state import FrontendPosition, GatewayState

IDENTITY = {"engine": {"dtype": "float32"}, "checkpoint": {"weights": {"m.safetensors": "abc"}}}
FINGERPRINT = hashlib.sha256(canonical_json(IDENTITY)).hexdigest()


def state(tmp_path: Path, frontend: FrontendPosition | None) -> GatewayState:
    metrics = GatewayMetrics()
    gateway = GatewayState(
        settings=GatewaySettings(state_dir=tmp_path),
        model_name="m",
        metrics=metrics,
        request_ledger=JsonLinesLedger(tmp_path / "ledger" / "requests.jsonl"),
        admission=AdmissionController(
            slots=LocalSlots(1), max_queued=0, queue_timeout_s=1, retry_after_s=1, metrics=metrics
        ),
        frontend=frontend,
    )
    gateway.gate.fingerprint = FINGERPRINT
    return gateway


def passing_record(qid: str) -> dict[str, object]:
    return {
        "qualification_id": qid, "created_at": "2026-11-30T00:00:00", "fingerprint": FINGERPRINT, "identity": IDENTITY,
        "verdict": {"result": "identical", "passed": True, "batched_result": "identical", "batched_passed": True},
    }


def test_a_record_written_elsewhere_opens_the_gate_and_its_removal_closes_it(tmp_path: Path) -> None:
    frontend = state(tmp_path, FrontendPosition(index=1, count=2, torch_threads=1))
    assert refresh_gate(frontend) is False
    path = record_store(frontend).write(passing_record("q-other-process"))  # as the process that qualified
    assert refresh_gate(frontend) is True and frontend.gate.qualification_id == "q-other-process"
    path.unlink()
    assert refresh_gate(frontend) is False and "no passing qualification record" in frontend.gate.reason


def test_a_gateway_of_one_process_keeps_its_own_gate(tmp_path: Path) -> None:
    alone = state(tmp_path, None)
    record_store(alone).write(passing_record("q-written-behind-its-back"))
    assert refresh_gate(alone) is False  # it reads the records at start-up and after its own qualifications only
