"""The HTTP front's limits against a real server process on loopback (the fake engine behind it).

Issue 12: with uvicorn's defaults a 60 MB header was accepted, a request head or
body dripped slowly (or a Content-Length larger than the body) held the
connection, and connections were unlimited. The server here is the gateway's
own configuration (`service.server.run_server`, via tests/fake_server.py) with
small limits so that each case takes about a second.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from gateway_process import free_port
from helpers import make_wav
from starlette.types import Message, Receive, Scope, Send

from service.body_deadline import BodyDeadlineMiddleware
from service.settings import ServerSettings

LIMITS = {
    "MAX_HEADER_BYTES": "16384",
    "HEADER_TIMEOUT_S": "1",
    "BODY_TIMEOUT_S": "4",
    "BODY_IDLE_TIMEOUT_S": "1",
    "BODY_MIN_RATE_BYTES_S": "2000",
    "MAX_CONNECTIONS": "4",
}
#: How long a refusal may take: the 1 s deadlines plus scheduling slack on a busy 2-core machine.
PROMPT_S = 3.5


@dataclass
class Front:
    port: int

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOSS_GATEWAY_")}
    env.update({f"MOSS_GATEWAY_SERVER__{name}": value for name, value in LIMITS.items()})
    state = tmp_path_factory.mktemp("front") / "state"
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "fake_server.py"), "--port", str(port),
         "--state-dir", str(state), "--drain", "1"],
        env=env,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and process.poll() is None, "fake server did not start"
        time.sleep(0.1)
    yield Front(port)
    process.terminate()
    process.wait(timeout=30)


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """What the server sent, and whether it closed the connection within `timeout`."""
    sock.settimeout(0.2)
    data = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def multipart_head(boundary: str = "b0undary") -> bytes:
    return (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()


def post_head(length: int, boundary: str = "b0undary") -> bytes:
    return (
        "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: gateway\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_a_normal_request_passes_the_limits(front: Front) -> None:
    files = {"file": ("a.wav", make_wav(2.0), "audio/wav")}
    response = httpx.post(f"http://127.0.0.1:{front.port}/v1/audio/transcriptions", files=files, timeout=30)
    assert response.status_code == 200, response.text


def test_oversized_header_is_refused_quickly(front: Front) -> None:
    started = time.monotonic()
    with front.connect() as sock:
        head = b"GET /health HTTP/1.1\r\nHost: gateway\r\nX-Padding: " + b"a" * (1 << 20) + b"\r\n\r\n"
        try:
            sock.sendall(head)
        except ConnectionError:
            pass  # the server stopped reading and closed: refused
        data, closed = read_until_closed(sock, PROMPT_S)
    assert closed, "the connection with a 1 MiB header stayed open"
    assert not data.startswith(b"HTTP/1.1 200"), data[:200]
    assert data == b"" or data.startswith(b"HTTP/1.1 400"), data[:200]
    assert time.monotonic() - started < PROMPT_S
    # Another client is served at once.
    health_started = time.monotonic()
    assert httpx.get(f"http://127.0.0.1:{front.port}/health", timeout=5).status_code == 200
    assert time.monotonic() - health_started < 1.0


def test_a_dripped_request_head_is_cut_off(front: Front) -> None:
    started = time.monotonic()
    with front.connect() as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: gateway\r\n")
        closed = False
        for index in range(int(PROMPT_S / 0.25)):
            try:
                sock.sendall(f"X-Drip-{index}: a\r\n".encode())
            except ConnectionError:
                closed = True
                break
            data, closed = read_until_closed(sock, 0.25)
            if closed:
                break
    assert closed, "a request head dripped for several seconds kept its connection"
    assert time.monotonic() - started < PROMPT_S


def test_a_dripped_body_is_cut_off_with_408(front: Front) -> None:
    started = time.monotonic()
    with front.connect() as sock:
        sock.sendall(post_head(100_000) + multipart_head())
        data, closed = b"", False
        for _ in range(int(PROMPT_S / 0.2)):
            try:
                sock.sendall(b"\0" * 10)  # 50 bytes/s: never silent for a second, far below 2000 bytes/s
            except ConnectionError:
                break
            chunk, closed = read_until_closed(sock, 0.2)
            data += chunk
            if closed:
                break
    assert data.startswith(b"HTTP/1.1 408"), data[:300]
    assert b"request_body_timeout" in data
    assert closed, "the connection stayed open after the 408"
    assert time.monotonic() - started < PROMPT_S


def test_a_body_shorter_than_its_content_length_is_cut_off_with_408(front: Front) -> None:
    started = time.monotonic()
    with front.connect() as sock:
        sock.sendall(post_head(100_000) + multipart_head() + b"\0" * 500)
        data, closed = read_until_closed(sock, PROMPT_S)
    assert data.startswith(b"HTTP/1.1 408"), data[:300]
    assert b"connection: close" in data.lower()
    assert closed
    assert time.monotonic() - started < PROMPT_S


def test_unauthenticated_upload_is_answered_at_once_and_its_body_not_waited_for(front: Front) -> None:
    """401 from the headers before any body is sent; the rest of a dripped body then holds nothing."""
    head = (
        "POST /admin/qualify HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer nope\r\n"
        f"Content-Type: multipart/form-data; boundary=b0undary\r\nContent-Length: {200 << 20}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    with front.connect() as sock:
        sock.sendall(head)  # a 200 MiB body announced, none of it sent
        sock.settimeout(PROMPT_S)
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert time.monotonic() - started < PROMPT_S
        closed = False
        for _ in range(int(PROMPT_S / 0.2)):  # keep dripping the body the server will never use
            try:
                sock.sendall(b"\0" * 100)
            except ConnectionError:
                closed = True
                break
            _, closed = read_until_closed(sock, 0.2)
            if closed:
                break
    assert closed, "the connection stayed open for the rest of a refused body"
    assert time.monotonic() - started < PROMPT_S + 1


def test_connections_beyond_the_limit_get_503(front: Front) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n"
    held = [front.connect() for _ in range(int(LIMITS["MAX_CONNECTIONS"]))]
    try:
        for sock in held:  # each one served, then left open (keep-alive)
            sock.sendall(request)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        with front.connect() as extra:
            extra.sendall(request)
            data, _ = read_until_closed(extra, PROMPT_S)
        assert data.startswith(b"HTTP/1.1 503"), data[:200]
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + PROMPT_S
    while httpx.get(f"http://127.0.0.1:{front.port}/health", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the limit did not free up after the connections closed"
        time.sleep(0.1)


def test_the_whole_body_has_a_deadline_even_at_a_good_rate() -> None:
    """In-process: pieces arrive often and fast enough, but the total passes `total_timeout_s`."""
    sent: list[Message] = []
    read_bytes = 0

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal read_bytes
        while True:
            message = await receive()
            read_bytes += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> Message:
        await asyncio.sleep(0.05)
        return {"type": "http.request", "body": b"x" * 1000, "more_body": True}  # 20 kB/s, forever

    async def send(message: Message) -> None:
        sent.append(message)

    middleware = BodyDeadlineMiddleware(app, total_timeout_s=0.5, idle_timeout_s=0.2, min_rate_bytes_s=1000)
    scope = {"type": "http", "headers": [(b"transfer-encoding", b"chunked")], "path": "/v1/audio/transcriptions"}
    started = time.monotonic()
    asyncio.run(middleware(scope, receive, send))
    assert time.monotonic() - started < 1.0
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert b"within 0.5 s" in sent[1]["body"]
    assert 0 < read_bytes < 20_000


def test_every_server_limit_is_documented() -> None:
    """docs/operations.md has a row for each limit of the HTTP front."""
    table = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    limits = set(ServerSettings.model_fields) - {"host", "port", "admin_token", "log_level"}
    assert limits, "no limits found"
    missing = sorted(name for name in limits if f"`SERVER__{name.upper()}`" not in table)
    assert not missing, f"docs/operations.md does not list {missing}"
