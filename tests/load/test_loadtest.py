"""tools/loadtest.py against a real HTTP server: uvicorn on 127.0.0.1 around the gateway on a FakeEngine.

CI-sized: 40 requests, 8 at a time, a few seconds. The load script's own main()
runs against the server; its JSON report is checked against what the gateway
recorded (ledger lines, request metrics).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import uvicorn
from fake_engine import FakeEngine
from helpers import open_gate

from service.app import create_app
from service.settings import GatewaySettings

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "[0.50][S01]Good morning everyone.[1.68][2.60][S02]The pipeline is ready.[3.71]"
TOKEN_DELAY_S = 0.002


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("moss_loadtest", REPO / "tools" / "loadtest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


loadtest = _load_tool()


API_KEY = "load-test-api-key"


@dataclass
class LiveGateway:
    url: str
    engine: FakeEngine
    state_dir: Path


@contextlib.contextmanager
def serve(state_dir: Path, engine: FakeEngine, **settings: object) -> Iterator[LiveGateway]:
    """uvicorn on 127.0.0.1 (a free port, bound before the server starts) in a thread, until the block ends."""
    app = create_app(
        GatewaySettings(state_dir=state_dir, **settings), engine_factory=lambda _: engine, on_ready=open_gate
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and thread.is_alive(), "the gateway did not become ready"
            time.sleep(0.02)
        yield LiveGateway(url, engine, state_dir)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@pytest.fixture(scope="module")
def live_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    state_dir = Path(tmp_path_factory.mktemp("load")) / "state"
    with serve(state_dir, FakeEngine(SCRIPT, token_delay_s=TOKEN_DELAY_S), access={"api_keys": [API_KEY]}) as gateway:
        yield gateway


def test_load_run_reports_sane_numbers(live_gateway: LiveGateway, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    before = len(live_gateway.engine.requests)
    started = time.monotonic()
    code = loadtest.main(
        [
            "--url",
            live_gateway.url,
            "--api-key",
            API_KEY,
            "--concurrency",
            "8",
            "--requests",
            "40",
            "--time-limit",
            "30",
            "--duration-s",
            "4",
            "--pid",
            str(os.getpid()),
            # The gateway runs in this process; other tests' servers may be its children.
            "--no-children",
            "--sample-interval",
            "0.02",
            "--json-out",
            str(out),
        ]
    )
    elapsed = time.monotonic() - started
    report = json.loads(out.read_text())
    assert code == 0, report
    assert elapsed < 30
    assert report["server_errors"] == 0 and report["transport_errors"] == 0, report["by_outcome"]
    assert report["sent"] == report["answered"] == report["ok"] == 40, report["by_outcome"]
    assert report["by_outcome"] == {"200": 40}
    assert report["stops"] == {"eos": 40}
    assert report["truncated"] == 0
    assert len(live_gateway.engine.requests) - before == 40

    throughput, latency = report["throughput"], report["latency_ok"]
    assert 0 < report["wall_s"] < 30
    assert throughput["requests_per_s"] == pytest.approx(40 / report["wall_s"])
    assert throughput["audio_s_per_s"] == pytest.approx(4 * 40 / report["wall_s"])
    # Each request generates len(SCRIPT)+1 tokens TOKEN_DELAY_S apart, so none can be faster than that.
    floor = len(SCRIPT) * TOKEN_DELAY_S
    assert latency["count"] == 40
    assert floor <= latency["min_s"] <= latency["p50_s"] <= latency["p90_s"] <= latency["p99_s"] <= latency["max_s"]
    assert latency["max_s"] < report["wall_s"] + 1e-6
    # 8 at a time: the wall time is well under 40 sequential requests.
    assert report["wall_s"] < 40 * latency["p50_s"]

    memory = report["memory"]
    assert memory["pid"] == os.getpid() and memory["error"] is None
    assert memory["samples"] >= 2
    assert 0 < memory["start_rss_bytes"] <= memory["peak_rss_bytes"]
    assert memory["end_rss_bytes"] <= memory["peak_rss_bytes"]
    if memory["vm_hwm_bytes"] is not None:  # Linux
        assert memory["vm_hwm_bytes"] >= memory["start_rss_bytes"] * 0.5

    # What the gateway recorded agrees with the load script.
    ledger = (live_gateway.state_dir / "ledger" / "requests.jsonl").read_text().splitlines()
    assert sum(1 for line in ledger if json.loads(line)["status"] == 200) >= 40
    metrics = httpx.get(f"{live_gateway.url}/metrics", trust_env=False).text  # not key-protected by default
    ok_count = re.search(
        r'moss_gateway_requests_total\{error_code="",route="/v1/audio/transcriptions",status="200"\} (\S+)', metrics
    )
    assert ok_count is not None and float(ok_count.group(1)) >= 40
    assert 'status="500"' not in metrics


def test_streaming_load_measures_first_event(
    live_gateway: LiveGateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "stream.json"
    code = loadtest.main(
        [
            "--url",
            live_gateway.url,
            "--api-key",
            API_KEY,
            "-c",
            "4",
            "-n",
            "8",
            "--time-limit",
            "20",
            "--duration-s",
            "4",
            "--stream",
            "--response-format",
            "verbose_json",
            "--json-out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert code == 0, report
    assert report["ok"] == 8 and report["stops"] == {"eos": 8}
    first, total = report["first_event"], report["latency_ok"]
    assert first["count"] == 8
    assert first["p50_s"] <= total["p50_s"]
    table = capsys.readouterr().out
    assert "first event" in table and "requests/s (ok)" in table


def test_errors_are_counted_by_status_and_code(live_gateway: LiveGateway, tmp_path: Path) -> None:
    """Refused requests are reported by status/code; they are not server errors."""
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all" * 10)
    out = tmp_path / "bad.json"
    code = loadtest.main(
        [
            "--url",
            live_gateway.url,
            "--api-key",
            API_KEY,
            "-c",
            "2",
            "-n",
            "6",
            "--time-limit",
            "20",
            "--file",
            str(bad),
            "--json-out",
            str(out),
            "--quiet",
        ]
    )
    report = json.loads(out.read_text())
    assert code == 0  # 4xx answers are answers: the gateway did its job
    assert report["by_outcome"] == {"400/invalid_audio": 6}
    assert report["ok"] == 0 and report["server_errors"] == 0
    assert report["throughput"]["audio_s_per_s"] is None or report["throughput"]["audio_s_per_s"] == 0
    assert report["latency_ok"]["p50_s"] is None
    assert report["latency_all_answered"]["count"] == 6


def test_missing_api_key_is_counted_as_401(live_gateway: LiveGateway, tmp_path: Path) -> None:
    out = tmp_path / "nokey.json"
    code = loadtest.main(["--url", live_gateway.url, "-c", "2", "-n", "4", "--json-out", str(out), "--quiet"])
    report = json.loads(out.read_text())
    assert code == 0 and report["by_outcome"] == {"401/unauthorized": 4}


def test_backpressure_answers_429_not_5xx(tmp_path: Path) -> None:
    """More concurrency than slots plus queue: the overflow is 429 with the envelope, never a 5xx."""
    engine = FakeEngine(SCRIPT, token_delay_s=0.01)  # about 0.8 s a request, so the slots stay busy
    limits = {"max_concurrent_requests": 2, "max_queued_requests": 2, "retry_after_s": 1}
    out = tmp_path / "429.json"
    with serve(tmp_path / "state", engine, limits=limits) as gateway:
        code = loadtest.main(
            [
                "--url",
                gateway.url,
                "-c",
                "8",
                "-n",
                "16",
                "--time-limit",
                "30",
                "--duration-s",
                "4",
                "--json-out",
                str(out),
                "--quiet",
            ]
        )
    report = json.loads(out.read_text())
    assert code == 0, report
    assert report["server_errors"] == 0 and report["transport_errors"] == 0
    assert set(report["by_outcome"]) == {"200", "429/too_many_requests"}, report["by_outcome"]
    assert report["by_outcome"]["429/too_many_requests"] >= 4
    assert report["ok"] >= 4
    assert len(engine.requests) == report["ok"]  # a refused request never reached the engine


def test_time_limit_bounds_the_run(live_gateway: LiveGateway, tmp_path: Path) -> None:
    """A cap shorter than the work: the run stops at the cap and says what it did not finish."""
    out = tmp_path / "capped.json"
    started = time.monotonic()
    loadtest.main(
        [
            "--url",
            live_gateway.url,
            "--api-key",
            API_KEY,
            "-c",
            "2",
            "-n",
            "1000",
            "--time-limit",
            "0.5",
            "--duration-s",
            "4",
            "--json-out",
            str(out),
            "--quiet",
        ]
    )
    assert time.monotonic() - started < 5
    report = json.loads(out.read_text())
    assert report["ok"] + report["cancelled"] + report["not_sent"] == 1000
    assert report["not_sent"] > 900
    assert report["server_errors"] == 0


def test_refuses_a_non_loopback_url_and_bad_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["--url", "http://192.0.2.10:8000"],
        ["--url", "http://example.invalid:8000"],
        ["--concurrency", "0"],
        ["--time-limit", "0"],
        ["--field", "novalue"],
    ):
        with pytest.raises(SystemExit) as exited:
            loadtest.main(argv)
        assert exited.value.code == 2, argv
    assert loadtest.is_loopback("http://127.0.0.5:1") and loadtest.is_loopback("http://[::1]:8000")
    assert loadtest.is_loopback("http://localhost:8000") and not loadtest.is_loopback("http://10.0.0.1")
    assert loadtest.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert loadtest.percentile([1.0] * 99 + [9.0], 99) == 1.0 and loadtest.percentile([1.0] * 98 + [9.0] * 2, 99) == 9.0
