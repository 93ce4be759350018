"""A real gateway process (`moss-gateway serve`) for the integration tests.

One gateway serves the whole session (the async engine's core starts in a child
process, about 20 s on 2 cores). It starts unqualified; `qualified_gateway`
records what a fresh gateway answers, then qualifies it through the CLI.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
ADMIN_TOKEN = "integration-admin-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gateway_env(base: Path, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOSS_GATEWAY_", "VLLM_"))}
    if "MOSS_GATEWAY_CACHE_DIR" in os.environ:
        env["MOSS_GATEWAY_CACHE_DIR"] = os.environ["MOSS_GATEWAY_CACHE_DIR"]
    for name in ("hf", "vllm", "inductor"):
        (base / name).mkdir(parents=True, exist_ok=True)
    # vLLM puts ZMQ IPC sockets under TMPDIR, and a socket path must stay under 108 bytes.
    short_tmp = tempfile.mkdtemp(prefix="mg-", dir="/tmp")
    env.update(
        HF_HOME=str(base / "hf"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CACHE_ROOT=str(base / "vllm"),
        TORCHINDUCTOR_CACHE_DIR=str(base / "inductor"),
        TMPDIR=short_tmp,
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
        MOSS_GATEWAY_STATE_DIR=str(base / "state"),
        MOSS_GATEWAY_SERVER__ADMIN_TOKEN=ADMIN_TOKEN,
        MOSS_GATEWAY_QUALIFICATION__QUALIFY_ON_START="false",
        MOSS_GATEWAY_ENGINE__MAX_MODEL_LEN="2048",
        MOSS_GATEWAY_ENGINE__KV_CACHE_MEMORY_BYTES=str(64 << 20),
        # Short chunks so that the chunked track runs on seconds of audio.
        MOSS_GATEWAY_LONGFORM__TARGET_S="12",
        MOSS_GATEWAY_LONGFORM__OVERLAP_S="2",
        MOSS_GATEWAY_LONGFORM__SEARCH_S="3",
        MOSS_GATEWAY_LONGFORM__MAX_CHUNK_S="18",
    )
    env.update(overrides)
    return env


@dataclass
class GatewayProcess:
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    before_qualification: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 120), **kwargs)

    def start(self) -> GatewayProcess:
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        return self

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_engine(self, timeout: float = 300) -> dict[str, Any]:
        """Until the engine is loaded and the gate has been decided (open or closed)."""
        deadline = time.monotonic() + timeout
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"gateway exited {self.process.returncode}:\n{self.log_tail()}")
            try:
                body = httpx.get(f"{self.url}/ready", timeout=5).json()
                backend = httpx.get(f"{self.url}/v1/backend", timeout=5).json()
                if body.get("engine") == "ready" and backend.get("fingerprint"):
                    return body
                if body.get("engine") == "failed":
                    raise AssertionError(f"engine failed: {body}\n{self.log_tail()}")
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"engine not ready after {timeout} s: {body}\n{self.log_tail()}")

    def wait_ready(self, timeout: float = 300) -> dict[str, Any]:
        """Until GET /ready answers 200 (engine loaded, healthy and qualified)."""
        deadline = time.monotonic() + timeout
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, self.log_tail()
            try:
                response = httpx.get(f"{self.url}/ready", timeout=5)
                body = response.json()
                if response.status_code == 200:
                    return body
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise AssertionError(f"not ready after {timeout} s: {body}\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def run_cli(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=timeout,
    )


