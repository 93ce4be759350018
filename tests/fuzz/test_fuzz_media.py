"""Malformed media and malformed forms posted to POST /v1/audio/transcriptions.

The corpus (fuzz_media.py) is generated in memory with a fixed seed. For every
entry: no 5xx; a refusal is a 4xx in the OpenAI envelope with a media error
code and the engine never saw it; an acceptance reached the engine with finite
samples. Afterwards the engine still serves a normal request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from fake_engine import FakeEngine
from fastapi.testclient import TestClient
from fuzz_media import MediaCase, build_corpus
from fuzz_support import envelope_problems
from helpers import make_wav, open_gate, wait_ready

from service.app import create_app
from service.settings import GatewaySettings

UPLOAD_CAP = 4 << 20
#: A refusal of any single input must come back fast (decompression bombs, huge declared sizes).
MAX_SECONDS_PER_REQUEST = 5.0
CORPUS = build_corpus()


@dataclass
class Gateway:
    client: TestClient
    engine: FakeEngine
    outcomes: dict[str, tuple[int, str]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    engine = FakeEngine()
    config = GatewaySettings(
        state_dir=Path(tmp_path_factory.mktemp("fuzz-media")) / "state", audio={"max_upload_bytes": UPLOAD_CAP}
    )
    app = create_app(config, engine_factory=lambda _: engine, on_ready=open_gate)
    with TestClient(app) as client:
        wait_ready(client)
        yield Gateway(client, engine)


def _post(gateway: Gateway, case: MediaCase) -> tuple[int, str]:
    engine = gateway.engine
    before = len(engine.requests)
    started = time.monotonic()
    response = gateway.client.post(
        "/v1/audio/transcriptions", files={"file": (case.filename, case.data, "application/octet-stream")}
    )
    elapsed = time.monotonic() - started
    problems = envelope_problems(response.status_code, response.headers, response.content)
    assert not problems, f"{case}: {problems}: {response.text[:500]}"
    assert elapsed < MAX_SECONDS_PER_REQUEST, f"{case} took {elapsed:.1f} s"
    seen = engine.requests[before:]
    if response.status_code == 200:
        assert len(seen) == 1, f"{case} answered 200 but the engine saw {len(seen)} requests"
        audio = seen[0].audio
        assert audio.size > 0 and np.isfinite(audio).all(), f"{case} reached the engine with non-finite samples"
        return 200, ""
    code = response.json()["error"]["code"]
    assert 400 <= response.status_code < 500, f"{case} -> {response.status_code}"
    assert not seen, f"{case} was refused ({code}) but the engine saw it"
    assert code in case.codes, f"{case} refused with {code}, expected one of {sorted(case.codes)}"
    return response.status_code, code


@pytest.mark.parametrize("case", CORPUS, ids=[case.name for case in CORPUS])
def test_malformed_media_is_refused_cleanly(gateway: Gateway, case: MediaCase) -> None:
    status, code = _post(gateway, case)
    gateway.outcomes[case.name] = (status, code)
    if case.expect == "refuse":
        assert status != 200, f"{case} was accepted"
    elif case.expect == "accept":
        assert status == 200, f"{case} was refused with {status} {code}"


def _part(boundary: str, name: str, data: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
    return f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"


def _form_cases() -> list[tuple[str, dict[str, str], bytes]]:
    wav = make_wav(1.0)
    b = "fuzzBoundary7MA4YWxkTrZu0gW"
    multipart = {"content-type": f"multipart/form-data; boundary={b}"}
    end = f"--{b}--\r\n".encode()
    audio = _part(b, "file", wav, "a.wav")
    return [
        ("no-content-type", {}, audio + end),
        ("json-body", {"content-type": "application/json"}, b'{"file": "UklGRg=="}'),
        ("urlencoded-file", {"content-type": "application/x-www-form-urlencoded"}, b"file=RIFF&model=x"),
        ("multipart-without-boundary", {"content-type": "multipart/form-data"}, audio + end),
        ("boundary-mismatch", {"content-type": "multipart/form-data; boundary=other"}, audio + end),
        ("no-closing-boundary", multipart, audio),
        ("binary-garbage-body", multipart, b"\x00\xff" * 4096),
        ("empty-body", multipart, b""),
        ("file-sent-as-text-field", multipart, _part(b, "file", b"RIFF....WAVE") + end),
        ("part-without-name", multipart, f"--{b}\r\nContent-Type: audio/wav\r\n\r\n".encode() + wav + b"\r\n" + end),
        ("part-header-garbage", multipart, f"--{b}\r\n".encode() + b"\xff\xfe: \x00\r\n\r\nxx\r\n" + end),
        ("too-many-fields", multipart, b"".join(_part(b, f"f{i}", b"x") for i in range(1_500)) + audio + end),
        ("too-many-files", multipart, b"".join(_part(b, f"f{i}", b"x", "x.bin") for i in range(1_100)) + audio + end),
        ("huge-prompt", multipart, _part(b, "prompt", b"p" * 900_000) + audio + end),
        ("response-format-not-utf8", multipart, _part(b, "response_format", b"\xff\xfe") + audio + end),
        ("temperature-nan", multipart, _part(b, "temperature", b"nan") + audio + end),
        ("temperature-inf", multipart, _part(b, "temperature", b"-inf") + audio + end),
        ("budget-5000-digits", multipart, _part(b, "max_completion_tokens", b"9" * 5_000) + audio + end),
        ("budget-float", multipart, _part(b, "max_completion_tokens", b"1e3") + audio + end),
        ("stream-garbage", multipart, _part(b, "stream", b"\x00maybe") + audio + end),
        ("granularity-word", multipart, _part(b, "timestamp_granularities[]", b"word") + audio + end),
        ("over-the-cap", multipart, _part(b, "file", bytes(UPLOAD_CAP + (128 << 10)), "big.wav") + end),
        # Fields the gateway accepts: odd but valid values must not break anything either.
        ("prompt-nul-and-bidi", multipart, _part(b, "prompt", "\x00\u202e\ufeff".encode()) + audio + end),
        ("hotwords-not-utf8", multipart, _part(b, "hotwords", b"\xc3\x28,\xa0\xa1") + audio + end),
        ("two-file-parts", multipart, audio + _part(b, "file", wav, "b.wav") + end),
        ("empty-filename", multipart, _part(b, "file", wav, "") + end),
        (
            "stream-with-nul-language",
            multipart,
            _part(b, "stream", b"true") + _part(b, "language", b"\x00") + audio + end,
        ),
    ]


FORM_CASES = _form_cases()


@pytest.mark.parametrize(("name", "headers", "body"), FORM_CASES, ids=[case[0] for case in FORM_CASES])
def test_malformed_form_is_refused_cleanly(gateway: Gateway, name: str, headers: dict[str, str], body: bytes) -> None:
    before = len(gateway.engine.requests)
    started = time.monotonic()
    response = gateway.client.post("/v1/audio/transcriptions", content=body, headers=headers)
    assert time.monotonic() - started < MAX_SECONDS_PER_REQUEST, name
    problems = envelope_problems(response.status_code, response.headers, response.content)
    assert not problems, f"{name}: {problems}: {response.text[:500]}"
    if response.status_code != 200:
        assert len(gateway.engine.requests) == before, f"{name} was refused but the engine saw it"


def test_chunked_upload_over_the_cap_is_413(gateway: Gateway) -> None:
    """No Content-Length: the cap is enforced while the body streams in."""
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        boundary = "chunkedBoundary"
        yield f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'.encode()
        for _ in range(2 * UPLOAD_CAP // 65_536):  # bounded: twice the cap at most
            sent += 65_536
            yield bytes(65_536)

    before = len(gateway.engine.requests)
    response = gateway.client.post(
        "/v1/audio/transcriptions",
        content=chunks(),
        headers={"content-type": "multipart/form-data; boundary=chunkedBoundary"},
    )
    assert response.status_code == 413, response.text
    assert not envelope_problems(response.status_code, response.headers, response.content)
    assert response.json()["error"]["code"] == "upload_too_large"
    assert len(gateway.engine.requests) == before


def test_engine_is_unharmed_after_the_corpus(gateway: Gateway) -> None:
    """Runs last in this module: the engine still serves, and nothing it saw was refused input."""
    client, engine = gateway.client, gateway.engine
    assert client.get("/ready").status_code == 200
    assert not engine.dead and not engine.running
    before = len(engine.requests)
    response = client.post("/v1/audio/transcriptions", files={"file": ("ok.wav", make_wav(4.0), "audio/wav")})
    assert response.status_code == 200, response.text
    assert response.json()["text"] == "Good morning everyone. The pipeline is ready."
    assert len(engine.requests) == before + 1
    accepted = sum(1 for status, _ in gateway.outcomes.values() if status == 200)
    refused = sum(1 for status, _ in gateway.outcomes.values() if status != 200)
    if gateway.outcomes:  # the corpus ran in this session (not deselected)
        assert refused >= 60, gateway.outcomes
        assert accepted >= 8, gateway.outcomes
    metrics = client.get("/metrics").text
    assert 'status="500"' not in metrics
