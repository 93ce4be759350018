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
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from bench.vllm_serve import _die_with_parent, log_tail, stop_session
from service.frontends import serve_frontends
from service.gate import open_gate_from_records
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


class GatewayProcesses:
    """One gateway with `api_processes` front ends for the whole run (started once, stopped at the end)."""

    def __init__(self, settings: GatewaySettings, *, api_processes: int, port: int, log_path: Path) -> None:
        server = settings.server.model_copy(update={"port": port, "api_processes": api_processes})
        self.settings = settings.model_copy(
            update={"server": server, "state_dir": settings.state_dir.with_name(settings.state_dir.name + "-mp")}
        )
        self.api_processes = api_processes
        self.url = f"http://127.0.0.1:{port}"
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
            if await asyncio.to_thread(every_frontend_ready, self.url, self.api_processes):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"gateway-mp was not ready within {timeout_s:.0f} s:\n{self.tail()}")
            await asyncio.sleep(1.0)
        self.ready_s = time.monotonic() - (self.started_at or time.monotonic())
        logger.info("gateway-mp ready in %.1f s", self.ready_s)

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
    args = argv if argv is not None else sys.argv[1:]
    settings = GatewaySettings.model_validate(json.loads(Path(args[0]).read_text()))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return serve_frontends(settings, on_ready=open_gate_for_benchmark)


if __name__ == "__main__":
    sys.exit(main())
