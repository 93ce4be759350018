"""Start a gateway with two front-end processes N times; report whether both came up with an identity.

    .venv/bin/python tools/frontend_starts.py [--starts 8] [--timeout-s 180] [--processes 2]

What docs/operations.md quotes about front ends whose first questions to the engine core got no answer
(on the CPU engine, embedded tiny checkpoint) comes from this loop: each start is a fresh
`moss-gateway serve` (tests/gateway_process.py), polled on /ready and /v1/backend on new connections
until every front end says `engine: ready` with a fingerprint ("ok"), or the timeout ("hang"). A front
end that gets no answer stops and is relaunched by its parent, so each start also counts the
`the engine core did not answer` warnings in its log: a start counts as good only with none. Under CPU
load (two busy loops beside it) about 1 start in 10 lost its answers before the parent kept vLLM's
listeners alive (service/engine/core_launch.py `LaunchedEngine.listeners`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from gateway_process import GatewayProcess, gateway_env  # noqa: E402


def one_start(base: Path, processes: int, timeout_s: float) -> tuple[bool, float, dict[int, tuple[str, bool]]]:
    gateway = GatewayProcess(env=gateway_env(base, MOSS_GATEWAY_SERVER__API_PROCESSES=str(processes)),
                             log_path=base / "gateway.log").start()
    started = time.monotonic()
    states: dict[int, tuple[str, bool]] = {}
    try:
        while time.monotonic() - started < timeout_s:
            try:
                ready = httpx.get(f"{gateway.url}/ready", timeout=3, headers={"Connection": "close"}).json()
                backend = httpx.get(f"{gateway.url}/v1/backend", timeout=3, headers={"Connection": "close"}).json()
                states[int(ready["frontend"]["index"])] = (ready["engine"], backend.get("fingerprint") is not None)
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            if len(states) == processes and all(state == ("ready", True) for state in states.values()):
                return True, time.monotonic() - started, states
            time.sleep(0.5)
        return False, time.monotonic() - started, states
    finally:
        assert gateway.process is not None
        os.killpg(gateway.process.pid, signal.SIGKILL)
        gateway.process.wait(30)


def unanswered_questions(log: Path) -> int:
    """How often a front end's identity question went unanswered in this start (each is followed by a retry or a relaunch)."""
    if not log.exists():
        return 0
    return log.read_text(errors="replace").count("the engine core did not answer in")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=8)
    parser.add_argument("--timeout-s", type=float, default=180.0)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="frontend-starts-"))
    print(f"logs under {root}", flush=True)
    results = []
    for start in range(args.starts):
        base = root / f"start-{start}"
        base.mkdir()
        ok, seconds, states = one_start(base, args.processes, args.timeout_s)
        unanswered = unanswered_questions(base / "gateway.log")
        results.append(ok and unanswered == 0)
        print(f"start {start}: {'ok' if ok else 'hang'} in {seconds:.1f} s, {unanswered} unanswered identity "
              f"question(s) {states}", flush=True)
        if ok:
            shutil.rmtree(base, ignore_errors=True)
    print(f"{results.count(True)} of {len(results)} starts came up with every identity question answered the first time", flush=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
