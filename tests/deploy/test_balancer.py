"""The balancer configs of deploy/balancer/ run on loopback in front of two gateways (fake engine).

What is checked is what each proxy really does with the shipped file: nginx
(open source, passive checks only) balances round robin, streams server-sent
events unbuffered, and takes an unqualified replica out after its first 503;
HAProxy (active checks on /ready) never sends it a request at all. The configs
are the files docs/operations.md shows; only addresses, ports and the run
directory (and the check interval, for speed) are filled in.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from gateway_process import free_port
from helpers import make_wav

REPO = Path(__file__).resolve().parents[2]
BALANCER = REPO / "deploy" / "balancer"
A, B, C = "a" * 64, "b" * 64, "c" * 64

pytestmark = pytest.mark.skipif(
    not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()), reason="nginx is not installed (scripts/bootstrap installs it as root)"
)


def binary(name: str) -> str:
    found = shutil.which(name) or f"/usr/sbin/{name}"
    if not Path(found).exists():
        pytest.skip(f"{name} is not installed (scripts/bootstrap installs it as root)")
    return found


def wait_http(url: str, process: subprocess.Popen[bytes], *, status: int | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            code = httpx.get(url, timeout=1).status_code
            if status is None or code == status:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None, f"{process.args} exited {process.returncode}"
        assert time.monotonic() < deadline, f"{url} did not answer"
        time.sleep(0.1)


class Replicas:
    """Fake-engine gateways on loopback, by fingerprint: `a` and `b` qualified, `c` not."""

    def __init__(self, base: Path) -> None:
        self.ports = {A: free_port(), B: free_port(), C: free_port()}
        self.processes: list[subprocess.Popen[bytes]] = []
        for fingerprint, port in self.ports.items():
            self.processes.append(subprocess.Popen(
                [sys.executable, str(REPO / "tests" / "fake_server.py"), "--port", str(port), "--state-dir",
                 str(base / fingerprint[0]), "--fingerprint", fingerprint, "--token-delay", "0.02", "--drain", "1",
                 *(["--unqualified"] if fingerprint == C else [])],
            ))
        for port, process in zip(self.ports.values(), self.processes, strict=True):
            wait_http(f"http://127.0.0.1:{port}/health", process, timeout=120)

    def address(self, fingerprint: str) -> str:
        return f"127.0.0.1:{self.ports[fingerprint]}"

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    started = Replicas(tmp_path_factory.mktemp("replicas"))
    yield started
    started.stop()


def fill(template: Path, values: dict[str, str], out: Path) -> Path:
    text = template.read_text()
    for key, value in values.items():
        text = text.replace(f"__{key}__", value)
    assert not re.search(r"\b__[A-Z_]+__\b", text), "a placeholder was left unfilled"
    out.write_text(text)
    return out


class Proxy:
    def __init__(self, argv: list[str], port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(argv)
        wait_http(f"{self.url}/health", self.process)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture
def pool(tmp_path: Path, replicas: Replicas) -> Iterator[Callable[..., Proxy]]:
    """`pool(kind, second)`: nginx or haproxy in front of replica `a` and replica `second`."""
    started: list[Proxy] = []

    def build(kind: str, second: str) -> Proxy:
        a, b = replicas.address(A), replicas.address(second)
        port = free_port()
        run = tmp_path / kind
        run.mkdir()
        if kind == "nginx":
            values = {"LOG_DIR": str(run), "BALANCE": "", "REPLICA_A": a, "REPLICA_B": b, "LISTEN": f"127.0.0.1:{port}"}
            conf = fill(BALANCER / "nginx.conf", values, run / "nginx.conf")
            argv = [binary("nginx"), "-c", str(conf), "-p", str(run), "-g", "daemon off;"]
        else:
            values = {"BALANCE": "balance roundrobin", "REPLICA_A": a, "REPLICA_B": b, "LISTEN": f"127.0.0.1:{port}",
                      "CHECK_INTERVAL": "200ms"}
            conf = fill(BALANCER / "haproxy.cfg", values, run / "haproxy.cfg")
            argv = [binary("haproxy"), "-db", "-f", str(conf)]
        proxy = Proxy(argv, port)
        started.append(proxy)
        return proxy

    yield build
    for proxy in started:
        proxy.stop()


def transcribe(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(1.0), "audio/wav")}, timeout=30)


def test_nginx_round_robin_over_two_ready_replicas(pool: Callable[..., Proxy]) -> None:
    proxy = pool("nginx", B)
    answers = [transcribe(proxy.url) for _ in range(6)]
    assert [r.status_code for r in answers] == [200] * 6
    served = [r.headers["x-moss-backend-fingerprint"] for r in answers]
    assert Counter(served) == {A: 3, B: 3} and all(x != y for x, y in zip(served, served[1:], strict=False))  # alternating


def test_nginx_passes_an_unqualified_replicas_503_through(pool: Callable[..., Proxy]) -> None:
    """Open-source nginx cannot take an unready replica out for POSTs: a 503 to a POST is passed on.

    Measured: `proxy_next_upstream ... http_503` with `max_fails=1` did not mark the replica failed for
    these non-idempotent requests; round robin kept sending it every other one. So the client gets the
    gateway's 503 (`backend_not_qualified`) and must retry; HAProxy's active checks (below) avoid that.
    """
    proxy = pool("nginx", C)
    answers = [transcribe(proxy.url) for _ in range(8)]
    refused = [r for r in answers if r.status_code == 503]
    assert refused and all(r.json()["error"]["code"] == "backend_not_qualified" for r in refused)
    assert {r.headers["x-moss-backend-fingerprint"] for r in answers if r.status_code == 200} == {A}


def test_nginx_passes_server_sent_events_through_unbuffered(pool: Callable[..., Proxy]) -> None:
    proxy = pool("nginx", B)
    arrivals: list[float] = []
    started = time.monotonic()
    with httpx.stream(
        "POST", f"{proxy.url}/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(1.0), "audio/wav")},
        data={"stream": "true"}, timeout=30,
    ) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data:"):
                arrivals.append(time.monotonic() - started)
    # About 70 tokens at 20 ms each: buffered, every event would arrive together at the end.
    assert len(arrivals) > 5 and arrivals[-1] - arrivals[0] > 0.5, arrivals


def test_nginx_keeps_metrics_and_admin_off_the_pool(pool: Callable[..., Proxy]) -> None:
    proxy = pool("nginx", B)
    assert httpx.get(f"{proxy.url}/metrics").status_code == 403
    assert httpx.post(f"{proxy.url}/admin/qualify").status_code == 403


def test_haproxy_active_checks_keep_an_unqualified_replica_out_entirely(pool: Callable[..., Proxy]) -> None:
    proxy = pool("haproxy", C)
    time.sleep(1.0)  # a few /ready checks at 200 ms: replica b is marked down (fall 2)
    answers = [transcribe(proxy.url) for _ in range(6)]
    assert [r.status_code for r in answers] == [200] * 6
    assert {r.headers["x-moss-backend-fingerprint"] for r in answers} == {A}


def test_the_docs_show_the_shipped_balancer_files() -> None:
    docs = (REPO / "docs" / "operations.md").read_text()
    for name in ("nginx.conf", "haproxy.cfg"):
        assert f"deploy/balancer/{name}" in docs
    for directive in ("proxy_buffering off;", "proxy_next_upstream error timeout http_503;", "max_fails=1 fail_timeout=30s"):
        assert directive in (BALANCER / "nginx.conf").read_text() and directive in docs, directive
    for directive in ("http-check send meth GET uri /ready", "http-check expect status 200"):
        assert directive in (BALANCER / "haproxy.cfg").read_text() and directive in docs, directive
