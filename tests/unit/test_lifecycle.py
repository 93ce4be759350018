"""Engine supervision on the fake engine: restart with backoff, /health 503 when it keeps failing, bounded /ready."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_engine import FakeEngine
from fastapi.testclient import TestClient
from gateway_process import free_port
from helpers import make_wav, open_gate

from service.app import create_app, restart_delay_s
from service.engine.protocol import EngineDeadError
from service.ledger import JsonLinesLedger
from service.settings import GatewaySettings, LifecycleSettings
from service.state import GatewayState

FAST = {
    "health_check_interval_s": 0.05,
    "restart_initial_delay_s": 0.05,
    "restart_max_delay_s": 0.2,
    "restart_max_attempts": 3,
}


class FlakyFactory:
    """Fails its first `failures` starts (all of them when None), then builds fake engines."""

    def __init__(self, failures: int | None) -> None:
        self.failures = failures
        self.calls: list[float] = []
        self.engines: list[FakeEngine] = []

    def __call__(self, _settings: GatewaySettings) -> FakeEngine:
        self.calls.append(time.monotonic())
        if self.failures is None or len(self.calls) <= self.failures:
            raise RuntimeError(f"no device (start {len(self.calls)})")
        engine = FakeEngine()
        self.engines.append(engine)
        return engine


class HangingHealthEngine(FakeEngine):
    """An engine whose health check never answers (a wedged engine core)."""

    async def check_health(self) -> None:
        await asyncio.Event().wait()


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[Any]:
    clients: list[TestClient] = []

    def build(factory: Any, **lifecycle: Any) -> TestClient:
        settings = GatewaySettings(state_dir=tmp_path / "state", lifecycle=lifecycle)
        client = TestClient(create_app(settings, engine_factory=factory, on_ready=open_gate))
        client.__enter__()
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.__exit__(None, None, None)


def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_backoff_doubles_from_the_initial_delay_up_to_the_cap() -> None:
    lifecycle = LifecycleSettings(restart_initial_delay_s=0.5, restart_max_delay_s=3.0)
    assert [restart_delay_s(lifecycle, n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]
    assert restart_delay_s(lifecycle, 10_000) == 3.0  # no overflow on a replica that failed for days


def test_an_engine_that_fails_to_start_twice_then_starts_is_recovered(app_client: Any) -> None:
    factory = FlakyFactory(failures=2)
    client = app_client(factory, **FAST)
    _until(lambda: client.get("/ready").status_code == 200, 10, "the engine never came up after two failed starts")
    assert len(factory.calls) == 3
    # Backoff: 0.05 s after the first failure, 0.1 s after the second.
    gaps = [later - earlier for earlier, later in zip(factory.calls, factory.calls[1:], strict=False)]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1, gaps
    assert client.get("/health").status_code == 200
    state = client.app.state.gateway  # type: ignore[attr-defined]
    _until(lambda: state.engine_failures == 0, 5, "a healthy probe did not reset the failure count")
    assert client.post("/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(2.0), "audio/wav")}).status_code == 200


def test_an_engine_that_always_fails_turns_health_503_with_the_reason(app_client: Any) -> None:
    factory = FlakyFactory(failures=None)
    client = app_client(factory, **FAST)
    _until(lambda: client.get("/health").status_code == 503, 10, "/health stayed 200 on an engine that never starts")
    body = client.get("/health").json()
    assert body["status"] == "failing"
    assert "3 consecutive times" in body["reason"] and "no device" in body["reason"]
    assert len(factory.calls) >= 3
    assert client.get("/ready").status_code == 503
    # The supervisor keeps trying (at the capped delay), so a transient fault can still heal.
    calls = len(factory.calls)
    _until(lambda: len(factory.calls) > calls, 5, "the supervisor gave up instead of retrying")


def test_engine_deaths_count_and_a_healthy_engine_clears_the_count(app_client: Any) -> None:
    """Deaths before the first passing probe add up; the replica is declared failing; a proven engine clears it."""
    built: list[FakeEngine] = []

    def factory(_settings: GatewaySettings) -> FakeEngine:
        engine = FakeEngine()
        engine.dead = len(built) < 3  # the first three engines die at once (a crash loop)
        built.append(engine)
        return engine

    client = app_client(factory, **FAST)
    _until(lambda: client.get("/health").status_code == 503, 10, "three deaths in a row did not fail /health")
    assert "3 consecutive times" in client.get("/health").json()["reason"]
    _until(lambda: client.get("/ready").status_code == 200, 10, "the fourth engine never served")
    # /health turns 200 once the new engine passed a probe (not merely started: a crash loop starts too).
    _until(lambda: client.get("/health").status_code == 200, 5, "a proven engine did not clear /health")
    assert len(built) == 4


def test_with_restarts_off_a_failed_start_is_final_and_health_says_so(app_client: Any) -> None:
    factory = FlakyFactory(failures=1)
    client = app_client(factory, restart_engine=False, health_check_interval_s=0.05)
    _until(lambda: client.get("/health").status_code == 503, 5, "/health stayed 200 with no way to recover")
    assert "restart_engine is off" in client.get("/health").json()["reason"]
    time.sleep(0.2)
    assert len(factory.calls) == 1


def test_ready_answers_503_within_its_timeout_when_the_health_check_hangs(app_client: Any) -> None:
    engine = HangingHealthEngine()
    # The supervisor's own probe is slow to judge (30 s), so only /ready's bound is under test here.
    client = app_client(lambda _: engine, ready_probe_timeout_s=0.3, health_check_interval_s=60)
    _until(lambda: engine.started, 5, "the engine never started")
    answers: list[Any] = []
    started = time.monotonic()
    probe = threading.Thread(target=lambda: answers.append(client.get("/ready")), daemon=True)
    probe.start()
    probe.join(timeout=5)
    elapsed = time.monotonic() - started
    assert answers, "/ready hung on the engine's health check"
    assert answers[0].status_code == 503
    assert "did not answer within 0.3 s" in " ".join(answers[0].json()["reasons"])
    assert elapsed < 2.0, elapsed
    assert client.get("/health").status_code == 200  # slow is not dead


def test_the_supervisor_probe_is_bounded_too(app_client: Any) -> None:
    engine = HangingHealthEngine()
    client = app_client(
        lambda _: engine, health_check_interval_s=0.05, health_check_timeout_s=0.2, restart_engine=False
    )
    _until(lambda: client.get("/ready").json()["engine"] == "dead", 5, "a wedged engine was never declared dead")
    assert "did not answer within 0.2 s" in client.get("/ready").json()["reasons"][0]


def test_the_engine_stopping_with_the_gateway_is_not_a_death(
    app_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A process-group SIGTERM (Ctrl-C, systemd) stops the engine core too, before the gateway's drain ends."""
    factory = FlakyFactory(failures=0)
    client = app_client(factory, **FAST)
    _until(lambda: client.get("/ready").status_code == 200, 5, "the engine never came up")
    state = client.app.state.gateway  # type: ignore[attr-defined]
    caplog.set_level("INFO")
    state.begin_shutdown()  # what the signal handler does, before uvicorn's drain
    factory.engines[0].dead = True  # the engine core got the same signal
    time.sleep(0.5)  # ten probe intervals
    assert len(factory.calls) == 1, "the supervisor restarted an engine that stopped with the gateway"
    assert state.engine_status.value == "ready" and state.engine_failures == 0
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING", "CRITICAL")], caplog.text
    assert client.get("/health").status_code == 200


def _fake_server(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "fake_server.py"), "--port", str(port),
         "--state-dir", str(tmp_path / "state"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return process, url
        assert time.monotonic() < deadline and process.poll() is None, process.stderr.read() if process.stderr else ""
        time.sleep(0.05)


def test_sigterm_stops_in_order_and_exits_0(tmp_path: Path) -> None:
    """uvicorn re-raises the signal after its orderly stop; the gateway's serve path turns that into exit 0."""
    process, url = _fake_server(tmp_path)
    assert httpx.get(f"{url}/admin/qualify", timeout=5).status_code == 401  # a line waiting in the ledger
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode(errors="replace")
    assert time.monotonic() - started < 10
    assert b"Traceback" not in stderr and b"EngineDeadError" not in stderr, stderr.decode(errors="replace")
    lines = list(JsonLinesLedger(tmp_path / "state" / "ledger" / "requests.jsonl").read())
    assert [(line["status"], line["path"]) for line in lines] == [(401, "/admin/qualify")]


def test_an_engine_that_cannot_answer_its_identity_is_dead_and_restarted(tmp_path: Path) -> None:
    """The ready hook's identity questions got no answer (EngineDeadError): not a closed gate forever, a restart."""
    factory = FlakyFactory(failures=0)
    asked: list[int] = []

    async def identity_unanswered_once(state: GatewayState) -> None:
        asked.append(len(factory.engines))
        if len(asked) == 1:
            raise EngineDeadError("the engine core did not answer within 45 s")
        await open_gate(state)

    settings = GatewaySettings(state_dir=tmp_path / "state", lifecycle=FAST)
    with TestClient(create_app(settings, engine_factory=factory, on_ready=identity_unanswered_once)) as client:
        _until(lambda: client.get("/ready").status_code == 200, 10, "the engine was not restarted after no answer")
    assert asked == [1, 2] and len(factory.engines) == 2
