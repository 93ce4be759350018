"""Several replicas behind a balancer: each answers for its own identity, and /ready keeps the pool honest.

The balancer here is the part of any standard one that matters to the gateway: a health check on
/ready that takes a replica out of the pool while it is not qualified, and round robin over the rest.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

from fake_engine import FakeEngine
from fastapi.testclient import TestClient
from helpers import make_wav

from service.app import create_app
from service.settings import GatewaySettings
from service.state import GatewayState


def replica(state_dir: Path, fingerprint: str | None) -> TestClient:
    async def gate(state: GatewayState) -> None:
        state.gate.fingerprint = fingerprint or "0" * 64
        if fingerprint is not None:
            state.gate.open, state.gate.qualification_id = True, f"q-{fingerprint[:6]}"

    engine = FakeEngine()
    client = TestClient(create_app(GatewaySettings(state_dir=state_dir), engine_factory=lambda _: engine, on_ready=gate))
    client.__enter__()
    deadline = time.monotonic() + 10
    while client.app.state.gateway.gate.fingerprint is None:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the replica never resolved its identity"
        time.sleep(0.01)
    return client


def balance(replicas: list[TestClient], requests: int) -> list[dict[str, str]]:
    pool = [r for r in replicas if r.get("/ready").status_code == 200]
    answers = []
    for client in itertools.islice(itertools.cycle(pool), requests):
        response = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(2.0), "audio/wav")})
        assert response.status_code == 200
        answers.append(dict(response.headers))
    return answers


def test_an_unqualified_replica_stays_out_and_each_answers_for_itself(tmp_path: Path) -> None:
    qualified = replica(tmp_path / "a", "a" * 64)
    unqualified = replica(tmp_path / "b", None)
    try:
        answers = balance([qualified, unqualified], 4)
        assert {a["x-moss-backend-fingerprint"] for a in answers} == {"a" * 64}
        # The second replica is qualified for its own identity (another host, another fingerprint).
        state = unqualified.app.state.gateway  # type: ignore[attr-defined]
        state.gate.fingerprint, state.gate.open, state.gate.qualification_id = "b" * 64, True, "q-bbbbbb"
        answers = balance([qualified, unqualified], 4)
        assert sorted({(a["x-moss-backend-fingerprint"], a["x-moss-qualification-id"]) for a in answers}) == [
            ("a" * 64, "q-aaaaaa"), ("b" * 64, "q-bbbbbb"),
        ]
        for client in (qualified, unqualified):
            assert client.app.state.gateway.request_ledger.flush(10)  # type: ignore[attr-defined]
        for name, fingerprint in (("a", "a" * 64), ("b", "b" * 64)):
            lines = (tmp_path / name / "ledger" / "requests.jsonl").read_text().splitlines()
            assert {json.loads(line)["fingerprint"] for line in lines} == {fingerprint}
    finally:
        qualified.__exit__(None, None, None)
        unqualified.__exit__(None, None, None)
