"""The scripts the images run: the entry point (admin-token secret) and the probes (HEALTHCHECK, qualify wait)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from deploy_recipes import DEPLOY

from service.state import EngineStatus

ENTRYPOINT = DEPLOY / "common" / "entrypoint.sh"
PROBE = DEPLOY / "common" / "probe.py"


class Stub:
    """A local /ready that answers a scripted sequence of (status, body), repeating the last."""

    def __init__(self, answers: list[tuple[int, dict]]) -> None:
        self.answers = list(answers)
        self.calls = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                status, body = stub.answers[min(stub.calls, len(stub.answers) - 1)]
                stub.calls += 1
                payload = json.dumps(body).encode() if self.path == "/ready" else b"{}"
                self.send_response(status if self.path == "/ready" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self) -> Stub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, timeout=30)


def ready_body(engine: str, qualified: bool) -> dict:
    return {"ready": engine == "ready" and qualified, "engine": engine, "qualified": qualified, "reasons": [] if qualified else ["backend not qualified: no record"]}


@pytest.fixture
def free_url() -> Iterator[str]:
    """A loopback URL where nothing listens."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield f"http://127.0.0.1:{port}"


def test_ready_probe_passes_only_a_qualified_gateway() -> None:
    with Stub([(200, ready_body("ready", True))]) as stub:
        assert probe("ready", "--url", stub.url).returncode == 0
    with Stub([(503, ready_body("ready", False))]) as stub:
        result = probe("ready", "--url", stub.url)
        assert result.returncode == 1 and "not qualified" in result.stderr


def test_ready_probe_fails_when_nothing_answers(free_url: str) -> None:
    assert probe("ready", "--url", free_url, "--request-timeout", "1").returncode == 1


def test_wait_engine_returns_once_loaded() -> None:
    answers = [(503, ready_body("starting", False))] * 2 + [(503, ready_body("ready", False))]
    with Stub(answers) as stub:
        result = probe("wait-engine", "--url", stub.url, "--interval", "0.05", "--timeout", "10")
    assert result.returncode == 0, result.stderr
    assert stub.calls == 3


def test_wait_engine_stops_on_a_failed_engine() -> None:
    with Stub([(503, ready_body("failed", False))]) as stub:
        assert probe("wait-engine", "--url", stub.url, "--interval", "0.05", "--timeout", "10").returncode == 2


def test_wait_engine_times_out(free_url: str) -> None:
    result = probe("wait-engine", "--url", free_url, "--interval", "0.05", "--timeout", "0.3", "--request-timeout", "0.2")
    assert result.returncode == 1 and "timed out" in result.stderr


def test_probe_knows_the_engine_states() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("moss_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    states = {status.value for status in EngineStatus}
    assert set(module.FAILED_STATES) <= states and "ready" in states and "starting" in states
    assert states - set(module.FAILED_STATES) == {"starting", "ready"}, "a new engine state needs a decision in probe.py"


def run_entrypoint(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return subprocess.run(["sh", str(ENTRYPOINT), "env"], env={**base, **env}, capture_output=True, text=True, timeout=30)


def test_entrypoint_exports_the_token_from_the_secret(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret-token\n")
    result = run_entrypoint(tmp_path, {"MOSS_GATEWAY_SERVER__ADMIN_TOKEN_FILE": str(secret)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "MOSS_GATEWAY_SERVER__ADMIN_TOKEN=s3cret-token" in lines
    assert not any(line.startswith("MOSS_GATEWAY_SERVER__ADMIN_TOKEN_FILE=") for line in lines)


def test_entrypoint_refuses_a_missing_or_empty_secret(tmp_path: Path) -> None:
    missing = run_entrypoint(tmp_path, {"MOSS_GATEWAY_SERVER__ADMIN_TOKEN_FILE": str(tmp_path / "absent")})
    assert missing.returncode == 64 and "not readable" in missing.stderr
    empty = tmp_path / "empty"
    empty.write_text("")
    assert run_entrypoint(tmp_path, {"MOSS_GATEWAY_SERVER__ADMIN_TOKEN_FILE": str(empty)}).returncode == 64


def test_entrypoint_passes_through_without_a_secret(tmp_path: Path) -> None:
    result = run_entrypoint(tmp_path, {"MOSS_GATEWAY_SERVER__ADMIN_TOKEN": "direct"})
    assert result.returncode == 0 and "MOSS_GATEWAY_SERVER__ADMIN_TOKEN=direct" in result.stdout.splitlines()


def test_entrypoint_is_executable_posix_sh() -> None:
    assert os.access(ENTRYPOINT, os.X_OK), "the image runs it directly (the Dockerfile chmods it too)"
    assert ENTRYPOINT.read_text().startswith("#!/bin/sh\n")
    assert subprocess.run(["sh", "-n", str(ENTRYPOINT)], timeout=30).returncode == 0
