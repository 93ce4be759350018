"""Helpers shared by the tests: audio makers and fake-app plumbing."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from fake_engine import FakeEngine
from fastapi.testclient import TestClient

from service.state import GatewayState


def make_wav(duration_s: float = 3.0, rate: int = 16_000, channels: int = 1, seed: int = 0) -> bytes:
    """A deterministic tone-plus-noise WAV."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(duration_s * rate)) / rate
    mono = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.01 * rng.standard_normal(t.size)
    data = np.stack([mono] * channels, axis=1) if channels > 1 else mono
    buffer = io.BytesIO()
    sf.write(buffer, data.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


async def open_gate(state: GatewayState) -> None:
    state.gate.open = True
    state.gate.fingerprint = "f" * 64
    state.gate.qualification_id = "q-test"
    state.gate.reason = "opened by the test"


def wait_ready(client: TestClient, timeout: float = 10.0) -> None:
    """Until the app's engine is ready and its gate open (read from the app, so auth does not matter)."""
    state = client.app.state.gateway  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if state.engine_status.value == "ready" and state.gate.open:
            return
        time.sleep(0.01)
    raise AssertionError(f"not ready: engine {state.engine_status.value}, gate: {state.gate.reason}")


AppFactory = Callable[..., tuple[TestClient, FakeEngine]]


def ledger_lines(client: Any) -> list[dict[str, Any]]:
    """The request ledger of an in-process app, after its writer thread wrote what was submitted."""
    ledger = client.app.state.gateway.request_ledger
    assert ledger.flush(10), "the ledger writer did not catch up"
    return list(ledger.read())


def wait_for_ledger_line(path: Path, request_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """A gateway process writes its ledger off the request path: wait for the line of `request_id`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if path.is_file():
            for raw in path.read_text(encoding="utf-8").splitlines():
                line = json.loads(raw)
                if line.get("request_id") == request_id:
                    return line  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"no ledger line for {request_id} in {path}"
        time.sleep(0.05)
