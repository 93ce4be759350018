"""Access, backpressure, timeouts, engine death and restart, on the fake engine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from fake_engine import FakeEngine
from helpers import AppFactory, make_wav, wait_ready

from service.app import create_app
from service.settings import GatewaySettings

KEY = {"Authorization": "Bearer key-one-0123456789"}


def transcribe(client, headers=None, **fields):
    return client.post(
        "/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(2.0), "audio/wav")}, data=fields,
        headers=headers or {},
    )


# -- access -----------------------------------------------------------------------------------


def test_api_keys_guard_v1_routes(fake_client: AppFactory, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# operators\nkey-two-0123456789\n")
    client, engine = fake_client(
        access={"api_keys": ["key-one-0123456789"], "api_keys_file": str(keys)}, server={"admin_token": "admin-secret-token"}
    )
    for headers in ({}, {"Authorization": "Bearer nope"}):
        response = transcribe(client, headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthorized"
        assert "nope" not in response.text
    assert client.get("/v1/models").status_code == 401
    assert engine.requests == []
    assert transcribe(client, KEY).status_code == 200
    assert transcribe(client, {"Authorization": "Bearer key-two-0123456789"}).status_code == 200
    assert client.get("/health").status_code == 200  # open unless protect_health
    # The admin token opens /v1/* (for admin-only fields); an API key never opens /admin.
    admin = {"Authorization": "Bearer admin-secret-token"}
    forced = transcribe(client, admin, ignore_eos="true", max_completion_tokens="30")
    assert forced.status_code == 200 and forced.headers["x-moss-stop"] == "max_tokens"
    assert client.get("/admin/qualify", headers=KEY).status_code == 401
    assert client.get("/metrics").status_code == 200
    backend = client.get("/v1/backend", headers=KEY).text
    assert "key-one-0123456789" not in backend and "key-two-0123456789" not in backend and "admin-secret-token" not in backend


def test_health_and_metrics_can_be_protected(fake_client: AppFactory) -> None:
    client, _ = fake_client(access={"api_keys": ["key-one-0123456789"], "protect_health": True, "protect_metrics": True})
    for path in ("/health", "/ready", "/metrics"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers=KEY).status_code == 200


def test_no_secret_in_logs(fake_client: AppFactory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    client, _ = fake_client(access={"api_keys": ["key-one-0123456789"]}, server={"admin_token": "admin-secret-token"})
    transcribe(client, {"Authorization": "Bearer wrong-key"})
    transcribe(client, KEY)
    assert "key-one-0123456789" not in caplog.text and "wrong-key" not in caplog.text and "admin-secret-token" not in caplog.text


# -- backpressure -------------------------------------------------------------------------------


def test_beyond_slots_and_queue_is_429_with_retry_after(fake_client: AppFactory) -> None:
    client, engine = fake_client(
        FakeEngine(token_delay_s=0.02), limits={"max_concurrent_requests": 1, "max_queued_requests": 0}
    )
    results: list[httpx.Response] = []
    first = threading.Thread(target=lambda: results.append(transcribe(client)))
    first.start()
    deadline = time.monotonic() + 5
    while not engine.running and time.monotonic() < deadline:
        time.sleep(0.005)
    refused = transcribe(client)
    first.join()
    assert results[0].status_code == 200
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "5"
    assert refused.json()["error"]["code"] == "too_many_requests"
    assert len(engine.requests) == 1


def test_queued_request_waits_for_a_slot(fake_client: AppFactory) -> None:
    client, engine = fake_client(
        FakeEngine(token_delay_s=0.005), limits={"max_concurrent_requests": 1, "max_queued_requests": 4}
    )
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(transcribe(client).status_code)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [200, 200, 200]
    assert len(engine.requests) == 3


def test_request_timeout_aborts_the_engine_request(fake_client: AppFactory) -> None:
    client, engine = fake_client(FakeEngine(token_delay_s=0.05), limits={"request_timeout_s": 0.3})
    response = transcribe(client)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "request_timeout"
    deadline = time.monotonic() + 5
    while not engine.aborted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.aborted == [engine.requests[0].request_id]


# -- engine death and restart -------------------------------------------------------------------


class RestartingFactory:
    """Each start builds a new fake engine, as a restarted vLLM engine would be a new one."""

    def __init__(self, token_delay_s: float = 0.0) -> None:
        self.engines: list[FakeEngine] = []
        self.token_delay_s = token_delay_s

    def __call__(self, _settings: GatewaySettings) -> FakeEngine:
        engine = FakeEngine(token_delay_s=self.token_delay_s)
        self.engines.append(engine)
        return engine


def test_engine_death_fails_in_flight_refuses_new_and_restarts(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient
    from helpers import open_gate

    factory = RestartingFactory(token_delay_s=0.02)
    settings = GatewaySettings(state_dir=tmp_path, lifecycle={"health_check_interval_s": 0.2})
    with TestClient(create_app(settings, engine_factory=factory, on_ready=open_gate)) as client:
        wait_ready(client)
        first = factory.engines[0]
        results: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: results.append(transcribe(client)))
        worker.start()
        while first.tokens_generated < 3:  # the request is generating, not just submitted
            time.sleep(0.005)
        first.dead = True
        worker.join()
        assert results[0].status_code == 500
        assert results[0].json()["error"]["code"] == "engine_error"
        ready = client.get("/ready")
        refused = transcribe(client)
        assert ready.status_code == 503
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] in ("engine_not_ready", "backend_not_qualified")
        deadline = time.monotonic() + 10
        while len(factory.engines) < 2 or client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, client.get("/ready").json()
            time.sleep(0.05)
        assert transcribe(client).status_code == 200
        assert len(factory.engines[1].requests) == 1


def test_engine_death_mid_stream_ends_with_an_error_event(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient
    from helpers import open_gate

    factory = RestartingFactory(token_delay_s=0.01)
    settings = GatewaySettings(state_dir=tmp_path, lifecycle={"restart_engine": False})
    with TestClient(create_app(settings, engine_factory=factory, on_ready=open_gate)) as client:
        wait_ready(client)
        events = []
        with client.stream(
            "POST", "/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(2.0), "audio/wav")},
            data={"stream": "true"},
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if len(events) == 3:
                        factory.engines[0].dead = True
        assert events[-1]["type"] == "error"
        assert events[-1]["error"]["code"] == "engine_error"
        assert client.get("/ready").status_code == 503


def test_health_probe_failure_marks_the_engine_dead(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient
    from helpers import open_gate

    factory = RestartingFactory()
    settings = GatewaySettings(
        state_dir=tmp_path, lifecycle={"health_check_interval_s": 0.05, "restart_engine": False}
    )
    with TestClient(create_app(settings, engine_factory=factory, on_ready=open_gate)) as client:
        wait_ready(client)
        factory.engines[0].dead = True  # no request in flight: only the probe can notice
        deadline = time.monotonic() + 5
        while client.get("/ready").json()["engine"] != "dead":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert transcribe(client).json()["error"]["code"] == "engine_not_ready"


# -- graceful shutdown --------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_fake_server(tmp_path: Path, *, drain: float, delay: float) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "fake_server.py"), "--port", str(port),
         "--state-dir", str(tmp_path / "state"), "--token-delay", str(delay), "--drain", str(drain)],
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)


def test_sigterm_drains_in_flight_requests_then_exits(tmp_path: Path) -> None:
    process, url = _start_fake_server(tmp_path, drain=20, delay=0.02)  # ~1.6 s per request
    results: list[httpx.Response] = []
    worker = threading.Thread(
        target=lambda: results.append(
            httpx.post(f"{url}/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(2.0), "audio/wav")}, timeout=30)
        )
    )
    worker.start()
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2)  # no longer accepting
    worker.join()
    assert process.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
    assert results[0].status_code == 200, results[0].text
    ledger = [json.loads(x) for x in (tmp_path / "state/ledger/requests.jsonl").read_text().splitlines()]
    assert [line["status"] for line in ledger] == [200]


def test_sigterm_past_the_drain_deadline_aborts(tmp_path: Path) -> None:
    process, url = _start_fake_server(tmp_path, drain=1, delay=0.2)  # ~16 s per request
    worker = threading.Thread(
        target=lambda: httpx.post(
            f"{url}/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(2.0), "audio/wav")}, timeout=30
        )
    )
    worker.daemon = True
    worker.start()
    time.sleep(0.5)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) in (0, -signal.SIGTERM)
    assert time.monotonic() - started < 8  # not the 16 s the request would have taken
    ledger = [json.loads(x) for x in (tmp_path / "state/ledger/requests.jsonl").read_text().splitlines()]
    assert [(line["status"], line["stop"]["stop"]) for line in ledger] == [(499, "aborted")]


def test_upload_cap_holds_for_a_chunked_body_without_length(fake_client: AppFactory) -> None:
    """No Content-Length to refuse up front: the cap is counted as the body streams in."""
    client, engine = fake_client(audio={"max_upload_bytes": 4096})
    boundary = "capboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()

    def body():
        yield head
        for _ in range(64):
            yield b"\0" * 4096  # 256 KiB, far past the cap
        yield f"\r\n--{boundary}--\r\n".encode()

    response = client.post(
        "/v1/audio/transcriptions", content=body(),
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "upload_too_large"
    assert engine.requests == []
