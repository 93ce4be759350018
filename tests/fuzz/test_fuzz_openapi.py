"""Schemathesis against the gateway's own OpenAPI schema, in-process through its ASGI app.

Every operation the schema lists is fuzzed (so routes added later are covered
without touching this file): with schema-conforming and schema-violating input;
with the right, the wrong or no credential (API key on /v1, admin token on
/admin); with a fixed seed and a bounded number of examples. The contract
checked: no 5xx, and every 4xx is the OpenAI error envelope from the one error
table. Half the transcription cases carry a real WAV in `file`, so the form
fields are fuzzed past decoding too, into the (fake) engine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import schemathesis
from fake_engine import FakeEngine
from fastapi import FastAPI
from fuzz_support import envelope_problems
from helpers import make_wav, open_gate
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi as schemathesis_asgi

from service.app import create_app
from service.settings import GatewaySettings

ADMIN_TOKEN = "fuzz-admin-token"
API_KEY = "fuzz-api-key-0123"
#: Which credential a case carries: the one its route wants, the other one, none, or a wrong one.
CREDENTIALS = ("right", "other", "none", "wrong")
TRANSCRIPTIONS = "POST /v1/audio/transcriptions"
#: Never sent with the admin token: it would start a real qualification run.
NEVER_AUTHORIZED = {"POST /admin/qualify"}
EXAMPLES = {TRANSCRIPTIONS: 150}
DEFAULT_EXAMPLES = 30


@dataclass
class FuzzTarget:
    app: FastAPI
    engine: FakeEngine
    schema: schemathesis.BaseSchema


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    engine = FakeEngine()
    config = GatewaySettings(
        state_dir=Path(tmp_path_factory.mktemp("fuzz-openapi")) / "state",
        server={"admin_token": ADMIN_TOKEN},
        access={"api_keys": [API_KEY]},
        audio={"max_upload_bytes": 4 << 20},
    )
    app = create_app(config, engine_factory=lambda _: engine, on_ready=open_gate)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=schemathesis.Config())
    try:
        with schemathesis_asgi.get_client(app) as client:  # starts the app's lifespan (the engine)
            deadline = time.monotonic() + 10
            while client.get("/ready").status_code != 200:
                assert time.monotonic() < deadline, client.get("/ready").text
                time.sleep(0.01)
        yield FuzzTarget(app, engine, schema)
    finally:
        schemathesis_asgi.shutdown_lifespans()


def _operations(schema: schemathesis.BaseSchema) -> list[schemathesis.APIOperation]:
    return [result.ok() for result in schema.get_all_operations()]


def test_schema_lists_the_public_routes(target: FuzzTarget) -> None:
    labels = {operation.label for operation in _operations(target.schema)}
    assert {TRANSCRIPTIONS, "GET /ready", "GET /health", "GET /metrics", "GET /v1/models"} <= labels


def _authorization(label: str, credential: str) -> dict[str, str] | None:
    admin_route = label.split(" ", 1)[1].startswith("/admin/")
    right, other = (ADMIN_TOKEN, API_KEY) if admin_route else (API_KEY, ADMIN_TOKEN)
    if credential == "right" and label in NEVER_AUTHORIZED:
        credential = "wrong"
    token = {"right": right, "other": other, "wrong": "not-a-key", "none": None}[credential]
    return {"Authorization": f"Bearer {token}"} if token else None


def _fuzz_operation(
    operation: schemathesis.APIOperation,
    mode: schemathesis.GenerationMode,
    wav: bytes,
    statuses: dict[int, int],
) -> int:
    """Run one operation's bounded, seeded fuzzing; returns how many requests it sent."""
    label = operation.label
    sent = 0

    @settings(
        max_examples=EXAMPLES.get(label, DEFAULT_EXAMPLES),
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        case=operation.as_strategy(generation_mode=mode),
        real_audio=st.booleans(),
        credential=st.sampled_from(CREDENTIALS),
    )
    def fuzz(case: schemathesis.Case, real_audio: bool, credential: str) -> None:
        nonlocal sent
        if real_audio and label == TRANSCRIPTIONS and isinstance(case.body, dict) and "file" in case.body:
            case.body = {**case.body, "file": wav}
        headers = _authorization(label, credential)
        response = case.call(headers=headers, timeout=30)
        sent += 1
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        case.validate_response(response, checks=[not_a_server_error], headers=headers)
        problems = envelope_problems(response.status_code, response.headers, response.content)
        assert not problems, f"{label} -> {response.status_code}: {problems}\n{case.as_curl_command(headers=headers)}"

    try:
        fuzz()
    except Unsatisfiable:
        # Negative mode cannot break a schema with no parameters to violate.
        assert mode is schemathesis.GenerationMode.NEGATIVE, label
    return sent


@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
def test_no_operation_answers_5xx_or_a_bare_error(target: FuzzTarget, mode: schemathesis.GenerationMode) -> None:
    wav = make_wav(1.0)
    statuses: dict[int, int] = {}
    exercised = {op.label: _fuzz_operation(op, mode, wav, statuses) for op in _operations(target.schema)}
    assert exercised[TRANSCRIPTIONS] >= 20, exercised
    if mode is schemathesis.GenerationMode.POSITIVE:
        assert statuses.get(200, 0) >= 5, f"too few cases got through to the engine: {statuses}"
    # The engine survived the fuzzing and still serves.
    with schemathesis_asgi.get_client(target.app) as client:
        assert client.get("/ready").status_code == 200
        ok = client.post(
            "/v1/audio/transcriptions",
            files={"file": ("ok.wav", wav, "audio/wav")},
            headers={"Authorization": f"Bearer {API_KEY}"},
        )
        assert ok.status_code == 200, ok.text
        assert ok.json()["text"]
    print(f"{mode.value}: {exercised} statuses={statuses}")
