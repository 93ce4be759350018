"""The `gateway-mp` path of the protocol: the gateway as deployed with several front-end processes.

`python -m bench.gateway_mp SETTINGS_JSON` serves the gateway with
`server.api_processes` front ends on one engine core (service/frontends.py),
with the harness's own settings, so that its engine is configured exactly as
the in-process one that `direct` and `gateway` share. It is a separate process
group with its own engine core (a front-end group cannot share the harness's
in-process engine), started once per run like `vllm serve`.

The gate: the service's own logic first (identity, records, the start-up
qualification when `--qualify`); a gate still closed is then opened for the
benchmark only, under an unqualified id, as the in-process gateway does with
`--allow-unqualified` (bench/harness.py).

The `direct-mp` path (`direct_port`): the group gets one API process
more than it has front ends, and that last one is not a front end but the bare
engine path, `direct`, as one more `AsyncLLM` client of the **same** engine core
(`run_direct_client`): a small control server on PORT runs a block of direct
requests when asked (`POST /direct`) and answers with its records. So
`gateway-mp` and `direct-mp` are compared on one engine, and the spread between
engine instances (several per cent on the GPU host) drops out of their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import psutil
import uvicorn
from setproctitle import setproctitle
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bench.harness import direct_block
from bench.vllm_serve import _die_with_parent, log_tail, stop_session
from bench.workloads import read_wav_float
from service.app import vllm_engine_factory
from service.engine.vllm_engine import FrontendClient
from service.frontends import FrontendArgs, frontend_client, run_frontend, serve_frontends
from service.gate import open_gate_from_records
from service.prompt import build_instruction
from service.settings import GatewaySettings
from service.state import GatewayState

logger = logging.getLogger("bench")

UNQUALIFIED_ID = "unqualified-benchmark"


async def open_gate_for_benchmark(state: GatewayState) -> None:
    """The service's gate step (with its start-up qualification when asked), then the benchmark-only opening."""
    try:
        await open_gate_from_records(state)
    except Exception as exc:  # a failed start-up qualification leaves the gate closed, as in the service
        logger.warning("the gate step failed: %s: %s", type(exc).__name__, exc)
    if state.gate.open:
        return
    state.gate.open, state.gate.qualification_id, state.gate.verdict = True, UNQUALIFIED_ID, "unqualified"
    state.gate.reason = "opened by the benchmark (bench/gateway_mp.py) without a passing qualification"


def every_frontend_ready(url: str, api_processes: int) -> bool:
    """/ready answered 200 by every front-end process (each new connection lands on any of them)."""
    seen: set[int] = set()
    for _ in range(8 * api_processes):
        try:
            response = httpx.get(f"{url}/ready", timeout=5, headers={"Connection": "close"})
        except httpx.TransportError:
            return False
        if response.status_code != 200:
            return False
        seen.add(int((response.json().get("frontend") or {}).get("index", 0)))
        if len(seen) >= api_processes:
            return True
    return False


#: The environment variable that tells the group's last API process to be the direct client, on this port.
DIRECT_PORT_ENV = "MOSS_BENCH_DIRECT_PORT"


def http_processes(api_processes: int, environ: Mapping[str, str]) -> int:
    """How many of the group's API processes accept the gateway's connections: all but the direct client, if any.

    Each accepting process gets its own listening socket; one made for the direct client would hold the
    connections the kernel hashed to it unanswered.
    """
    return api_processes - (1 if environ.get(DIRECT_PORT_ENV) else 0)


def bench_target(listen_address: str, sock: socket.socket, args: FrontendArgs, client_config: dict[str, Any]) -> None:
    """What each API process of the benchmark's group runs: front ends, and the direct client last (if asked)."""
    last = int(client_config["client_index"]) == int(client_config["client_count"]) - 1
    if last and os.environ.get(DIRECT_PORT_ENV):
        run_direct_client(sock, args, client_config, port=int(os.environ[DIRECT_PORT_ENV]))
    else:
        run_frontend(listen_address, sock, args, client_config)


def run_direct_client(sock: socket.socket, args: FrontendArgs, client_config: dict[str, Any], *, port: int) -> None:
    """The direct path as one more client of the group's engine core, driven over a control port."""
    sock.close()  # never accepts the gateway's connections: those are the front ends'
    setproctitle("moss-gateway::bench-direct")
    app = direct_app(args.settings, frontend_client(client_config))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def direct_app(settings: GatewaySettings, client: FrontendClient) -> Starlette:
    """`GET /ready` (200 once the engine client is up) and `POST /direct` (one block of direct requests)."""
    engine = vllm_engine_factory(settings, frontend=client)
    started: dict[str, bool] = {"up": False}
    instruction = build_instruction(None, ())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.start()  # on the running loop, as the front ends build theirs (service/app.py)
        await engine.attention_backends()  # its first answer from the core: the client is live
        started["up"] = True
        try:
            yield
        finally:
            engine.shutdown()

    async def ready(request: Request) -> JSONResponse:
        return JSONResponse({"ready": started["up"]}, status_code=200 if started["up"] else 503)

    async def run_block(request: Request) -> JSONResponse:
        spec = await request.json()
        audios = [read_wav_float(Path(f)) for f in spec["files"]]  # decoded before the clock starts, as `direct`
        cpu_started = time.process_time()
        wall, records = await direct_block(
            engine, audios, int(spec["concurrency"]), int(spec["requests_per_worker"]), int(spec["max_tokens"]),
            instruction, stream_deltas=False,
        )
        return JSONResponse({"wall_s": wall, "records": records, "cpu_s": time.process_time() - cpu_started})

    routes = [Route("/ready", ready), Route("/direct", run_block, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan)


class GatewayProcesses:
    """One gateway with `api_processes` front ends for the whole run (started once, stopped at the end)."""

    def __init__(
        self, settings: GatewaySettings, *, api_processes: int, port: int, log_path: Path, direct_port: int | None = None
    ) -> None:
        # with a direct client, one API process more than front ends (bench_target makes the last one direct)
        processes = api_processes + (1 if direct_port else 0)
        server = settings.server.model_copy(update={"port": port, "api_processes": processes})
        self.settings = settings.model_copy(
            update={"server": server, "state_dir": settings.state_dir.with_name(settings.state_dir.name + "-mp")}
        )
        self.api_processes = api_processes
        self.url = f"http://127.0.0.1:{port}"
        self.direct_url = f"http://127.0.0.1:{direct_port}" if direct_port else None
        token = settings.server.admin_token
        self.token = token.get_secret_value() if token else None
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.ready_s: float | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        settings_path = self.log_path.with_suffix(".settings.json")
        document = self.settings.model_dump(mode="json")
        document["server"]["admin_token"] = self.token
        settings_path.write_text(json.dumps(document))
        env = dict(os.environ)
        root = Path(os.environ.get("VLLM_CACHE_ROOT", "~/.cache/vllm")).expanduser()
        env["VLLM_CACHE_ROOT"] = str(root / "bench-gateway-mp")  # its own compile cache, like vllm serve's
        if self.direct_url:
            env[DIRECT_PORT_ENV] = self.direct_url.rsplit(":", 1)[1]
        log = self.log_path.open("wb")
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.gateway_mp", str(settings_path)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=_die_with_parent,
        )
        log.close()
        logger.info("gateway-mp started (pid %d, %d front ends)", self.process.pid, self.api_processes)

    async def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"gateway-mp exited before it was ready; see {self.log_path}:\n{self.tail()}")
            if await asyncio.to_thread(every_frontend_ready, self.url, self.api_processes) and await self._direct_ready():
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"gateway-mp was not ready within {timeout_s:.0f} s:\n{self.tail()}")
            await asyncio.sleep(1.0)
        self.ready_s = time.monotonic() - (self.started_at or time.monotonic())
        logger.info("gateway-mp ready in %.1f s", self.ready_s)

    async def _direct_ready(self) -> bool:
        if self.direct_url is None:
            return True
        try:
            async with httpx.AsyncClient(timeout=5) as client:
                return (await client.get(f"{self.direct_url}/ready")).status_code == 200
        except httpx.TransportError:
            return False

    async def direct_block(
        self, files: list[Path], concurrency: int, per_worker: int, max_tokens: int
    ) -> tuple[float, list[dict[str, Any]], float | None]:
        """One block of the direct-mp path: wall time, records and the direct client's CPU seconds."""
        if self.direct_url is None:
            raise RuntimeError("gateway-mp was started without a direct client (direct_port)")
        spec = {"files": [str(f) for f in files], "concurrency": concurrency, "requests_per_worker": per_worker,
                "max_tokens": max_tokens}
        async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as client:
            answer = (await client.post(f"{self.direct_url}/direct", json=spec)).raise_for_status().json()
        return float(answer["wall_s"]), list(answer["records"]), answer.get("cpu_s")

    def cpu_s(self) -> float | None:
        """User plus system CPU seconds of the parent and its front-end processes.

        Not the engine core or its workers: `direct`'s figure is its one process
        (the in-process engine's client side), whose engine core and workers are
        child processes it does not count either; vLLM's busy loops there would
        swamp the front ends' share.
        """
        if self.process is None:
            return None
        try:
            root = psutil.Process(self.process.pid)
            ours = [root, *(c for c in root.children() if "moss-gateway::frontend-" in " ".join(c.cmdline()))]
            return sum(times.user + times.system for times in (proc.cpu_times() for proc in ours))
        except psutil.Error:
            return None

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, timeout_s: float = 60.0) -> None:
        process, self.process = self.process, None
        if process is not None:
            # The parent alone: it stops its front ends, then the engine core.
            stop_session(process, lambda: os.kill(process.pid, signal.SIGTERM), timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_mp")
    parser.add_argument("settings", type=Path)
    args = parser.parse_args(argv)
    settings = GatewaySettings.model_validate(json.loads(args.settings.read_text()))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serving = http_processes(settings.server.api_processes, os.environ)
    return serve_frontends(settings, on_ready=open_gate_for_benchmark, target=bench_target, http_processes=serving)


if __name__ == "__main__":
    sys.exit(main())
