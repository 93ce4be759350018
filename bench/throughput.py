"""The interleaved protocol's runner: ``python -m bench throughput`` (issue 13).

What runs where:

* one harness process holds the gateway app (uvicorn on 127.0.0.1) and, through
  its lifespan, the one in-process engine. **`direct` and `gateway` share that
  engine instance**: `direct` calls the same engine object's `generate` from
  the same event loop with exactly the engine request the gateway builds for an
  unstreamed request (`stream_deltas=False`, vLLM final-only output), `gateway`
  posts WAV files over HTTP from a separate client process (`bench.client`). So
  the two differ by the gateway's work only, and neither pays for a second
  engine's start or warm-up;
* `vllm-serve`: vLLM's own OpenAI server (`python -m bench.vllm_serve serve ...`,
  the same engine arguments as the gateway's adapter, see `bench.vllm_serve`),
  a separate process started **once per run**, concurrently with the in-process
  engine, and driven by the same client process over HTTP on loopback. Its
  generated tokens come from its `/metrics` (`vllm:generation_tokens_total`)
  read before and after each block, since its HTTP API cannot force the length.

Two engines then share the device: on the GPU both get the same explicit KV
cache size (`--kv-cache-memory-bytes`) and a memory fraction that lets both fit
(bench/device/throughput.sh). Paths run one at a time, never at once.

Per cell: one warm-up request of the shape per path, then `repeats` repetitions;
in repetition r the paths run in the order `rotation(paths, r)`. Every block is
one raw row (`bench.protocol.block_row`: cell, path, repeat, position, wall_s,
requests, audio seconds, tokens, concurrency, CPU per request); the summary per
cell (medians, per-repetition ratios, spread) is computed from those rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.harness import EngineBench, _free_port, _runner, direct_block, estimate_cell_s
from bench.protocol import (
    MIN_REPEATS,
    MULTIPROCESS_DIRECT_PATH,
    MULTIPROCESS_PATH,
    block_row,
    schedule,
    summarize_cells,
)
from bench.workloads import Cell, describe_cell, pcm16_to_float, write_wav

logger = logging.getLogger("bench")


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of one process (Linux /proc), None where unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15 of stat)


class ThroughputBench(EngineBench):
    def __init__(self, args: Any, cells: list[Cell], out_path: Path) -> None:
        super().__init__(args, cells, out_path)
        self.repeats = max(MIN_REPEATS, int(args.repeats))
        self.result["kind"] = "throughput"
        self.result["protocol"] = {
            "repeats": self.repeats,
            "paths": list(cells[0].paths) if cells else [],
            "order": "rotated by one place per repetition (bench.protocol.rotation)",
            "direct": "the gateway's engine object in-process, final-only output (the gateway's own engine request)",
            "gateway": "the real gateway over HTTP on loopback, client in a separate process",
            "vllm-serve": "vLLM's own OpenAI server on the same engine arguments, one process for the whole run",
            "shared_engine": "direct and gateway share one in-process engine; vllm-serve has its own",
        }
        self.result["summary"] = []
        self.serve: Any = None
        self.serve_model: str | None = None
        self.serve_ready = False
        self.serve_note: dict[str, Any] = {}
        self.result["vllm_serve"] = self.serve_note
        wants_serve = any("vllm-serve" in c.paths for c in cells)
        if wants_serve and self.paced_ms:
            self._drop_serve("the paced stand-in engine has no vllm serve counterpart")
        elif wants_serve:
            from bench.vllm_serve import VllmServe, serve_args, served_model_name

            settings = self.settings()
            port = _free_port()
            argv = serve_args(settings, port=port, api_server_count=getattr(args, "api_server_count", None))
            log = args.serve_log or out_path.with_name(out_path.stem + "-vllm-serve.log")
            self.serve = VllmServe(argv, log_path=Path(log), url=f"http://127.0.0.1:{port}")
            self.serve_model = served_model_name(settings)
            self.serve_note.update(argv=argv, log=str(log), model=self.serve_model)

        self.mp: Any = None
        self.mp_ready = False
        self.mp_note: dict[str, Any] = {}
        self.result["gateway_mp"] = self.mp_note
        if any(p in c.paths for c in cells for p in MP_PATHS):
            from bench.gateway_mp import GatewayProcesses

            count = int(getattr(args, "api_processes", None) or 4)
            log = out_path.with_name(out_path.stem + "-gateway-mp.log")
            direct_port = _free_port() if any(MULTIPROCESS_DIRECT_PATH in c.paths for c in cells) else None
            self.mp = GatewayProcesses(
                self.settings(), api_processes=count, port=_free_port(), log_path=log, direct_port=direct_port
            )
            self.mp_note.update(api_processes=count, log=str(log), direct_client=direct_port is not None)
            self.result["protocol"][MULTIPROCESS_PATH] = (
                f"the gateway with {count} front-end processes on its own engine core (same settings), "
                "one process group for the whole run"
            )
            if direct_port is not None:
                self.result["protocol"][MULTIPROCESS_DIRECT_PATH] = (
                    "direct (final-only engine requests, decoded audio) as one more AsyncLLM client of gateway-mp's "
                    "engine core, in its own process: gateway-mp's same-engine reference"
                )

    def _drop_serve(self, reason: str) -> None:
        logger.warning("vllm-serve path skipped: %s", reason)
        self.serve_note["skipped"] = reason
        self.result["skipped"].append(f"vllm-serve: {reason}")
        self.cells = [_without(c, "vllm-serve") for c in self.cells]
        self.serve = None

    def estimate_cell_s(self, cell: Cell) -> float:
        """A cell starts when one repetition fits (run_cell stops early when the next one does not)."""
        return estimate_cell_s(cell)

    def _left_s(self) -> float:
        return float(self.args.deadline_s) - (time.monotonic() - self.started)

    async def run(self) -> dict[str, Any]:
        if self.serve is not None:
            self.serve.start()  # loads while the in-process engine loads
        if self.mp is not None:
            self.mp.start()
        try:
            return await super().run()
        finally:
            if self.serve is not None:
                self.serve_note["ready_s"] = self.serve.ready_s
                await asyncio.to_thread(self.serve.stop)
            if self.mp is not None:
                self.mp_note["ready_s"] = self.mp.ready_s
                await asyncio.to_thread(self.mp.stop)
            self._save()

    async def _ensure_mp(self) -> bool:
        if self.mp is None:
            return False
        if self.mp_ready:
            return True
        try:
            await self.mp.wait_ready(self.args.start_timeout_s)
            self.mp_ready = True
            return True
        except Exception as exc:
            self.mp_note["error"] = f"{type(exc).__name__}: {exc}"[-4000:]
            logger.warning("%s path skipped: %s", MULTIPROCESS_PATH, exc)
            self.result["skipped"].append(f"{MULTIPROCESS_PATH}: did not start ({type(exc).__name__})")
            await asyncio.to_thread(self.mp.stop)
            self.mp = None
            self.cells = [_without(_without(c, MULTIPROCESS_PATH), MULTIPROCESS_DIRECT_PATH) for c in self.cells]
            return False

    async def _ensure_serve(self) -> bool:
        if self.serve is None:
            return False
        if self.serve_ready:
            return True
        try:
            await self.serve.wait_ready(self.args.start_timeout_s)
            self.serve_ready = True
            return True
        except Exception as exc:
            self.serve_note["error"] = f"{type(exc).__name__}: {exc}"[-4000:]
            await asyncio.to_thread(self.serve.stop)
            self._drop_serve(f"vllm serve did not start: {type(exc).__name__}")
            return False

    async def run_cell(self, state: Any, cell: Cell) -> None:
        from service.prompt import build_instruction

        if "vllm-serve" in cell.paths and not await self._ensure_serve():
            cell = _without(cell, "vllm-serve")
        if any(p in cell.paths for p in MP_PATHS) and not await self._ensure_mp():
            cell = _without(_without(cell, MULTIPROCESS_PATH), MULTIPROCESS_DIRECT_PATH)
        logger.info("cell %s, %d repetitions", describe_cell(cell), self.repeats)
        instruction = build_instruction(None, ())
        engine = state.engine
        cell_dir = self.work / cell.name
        cell_dir.mkdir(parents=True, exist_ok=True)
        t_cell = time.monotonic()
        n = cell.num_requests

        # warm-up: one request of this shape per path (kernels, allocator, graphs, connections)
        for path in cell.paths:
            pcm = self._audio(cell, 1)[0]
            if path == MULTIPROCESS_DIRECT_PATH:
                wav = write_wav(cell_dir / f"warmup-{path}.wav", pcm)
                await self.mp.direct_block([wav], 1, 1, cell.warmup_tokens)
                wav.unlink(missing_ok=True)
            elif path.startswith("direct"):
                await direct_block(
                    engine,
                    [pcm16_to_float(pcm)],
                    1,
                    1,
                    cell.warmup_tokens,
                    instruction,
                    stream_deltas=False,
                    want_logprobs=_logprobs(path),
                )
            else:
                wav = write_wav(cell_dir / f"warmup-{path}.wav", pcm)
                await self.gateway_block(
                    cell, [wav], 1, 1, cell.warmup_tokens, f"warmup-{path}", target=self._target(path)
                )
                wav.unlink(missing_ok=True)

        repeat_started = time.monotonic()
        for repeat, position, path in schedule(cell.paths, self.repeats):
            if position == 0 and repeat > 0:
                last_repeat_s, repeat_started = time.monotonic() - repeat_started, time.monotonic()
                if 1.15 * last_repeat_s > self._left_s():
                    note = (
                        f"{cell.name}: stopped after {repeat} of {self.repeats} repetitions "
                        f"(one takes {last_repeat_s:.0f} s, {self._left_s():.0f} s left)"
                    )
                    logger.warning(note)
                    self.result["skipped"].append(note)
                    break
            pcms = self._audio(cell, n)
            in_process = path.startswith("direct") and path != MULTIPROCESS_DIRECT_PATH
            files = [] if in_process else [write_wav(cell_dir / f"r{repeat}-{i}.wav", p) for i, p in enumerate(pcms)]
            audios = [pcm16_to_float(p) for p in pcms] if in_process else []
            tokens_before = await self.serve.generation_tokens() if path == "vllm-serve" else None
            serve_cpu = process_cpu_s(self.serve.process.pid) if path == "vllm-serve" else None
            mp_cpu = self.mp.cpu_s() if path == MULTIPROCESS_PATH else None
            direct_mp_cpu: float | None = None
            cpu_started, loop_started = time.process_time(), time.thread_time()
            if path == MULTIPROCESS_DIRECT_PATH:
                wall, records, direct_mp_cpu = await self.mp.direct_block(
                    files, cell.concurrency, cell.requests_per_worker, cell.output_tokens
                )
            elif in_process:
                wall, records = await direct_block(
                    engine,
                    audios,
                    cell.concurrency,
                    cell.requests_per_worker,
                    cell.output_tokens,
                    instruction,
                    stream_deltas=False,
                    want_logprobs=_logprobs(path),
                )
            else:  # gateway or vllm-serve: the same HTTP driver; only the gateway's loop is profiled
                profiled = path == "gateway"
                with self.profiler if profiled else contextlib.nullcontext():
                    wall, records = await self.gateway_block(
                        cell,
                        files,
                        cell.concurrency,
                        cell.requests_per_worker,
                        cell.output_tokens,
                        f"r{repeat}",
                        target=self._target(path),
                    )
                if profiled:
                    self.profiler.requests += len(records)
            cpu_s: float | None = time.process_time() - cpu_started
            loop_cpu_s: float | None = time.thread_time() - loop_started
            generated = None
            if path == "vllm-serve":
                tokens_after = await self.serve.generation_tokens()
                if tokens_before is not None and tokens_after is not None:
                    generated = int(round(tokens_after - tokens_before))
                after = process_cpu_s(self.serve.process.pid)
                cpu_s = None if serve_cpu is None or after is None else after - serve_cpu
                loop_cpu_s = None
            if path == MULTIPROCESS_PATH:
                mp_after = self.mp.cpu_s()
                cpu_s = None if mp_cpu is None or mp_after is None else mp_after - mp_cpu
                loop_cpu_s = None
            if path == MULTIPROCESS_DIRECT_PATH:
                cpu_s, loop_cpu_s = direct_mp_cpu, None
            for f in files:
                f.unlink(missing_ok=True)
            row = block_row(
                cell=cell,
                path=path,
                repeat=repeat,
                position=position,
                wall_s=wall,
                records=records,
                generated_tokens=generated,
                cpu_s=cpu_s,
                loop_cpu_s=loop_cpu_s,
            )
            self.result["rows"].append(row)
            self.result["records"][f"{cell.name}/{path}/r{repeat}"] = records
            logger.info(
                "  r%d #%d %s: %d/%d ok in %.3f s, %.1f audio-s/s, %s tokens",
                repeat,
                position,
                path,
                row["ok"],
                row["requests"],
                wall,
                row["audio_s_per_s"] or 0.0,
                row["generated_tokens"],
            )
            self._save()

        self.result["summary"] = summarize_cells(self.result["rows"])
        self.result["cells"].append(
            {
                "cell": cell.as_dict(),
                "repeats": self.repeats,
                "repeats_done": len({r["repeat"] for r in self.result["rows"] if r["cell"] == cell.name}),
                "elapsed_s": time.monotonic() - t_cell,
            }
        )
        try:
            cell_dir.rmdir()
        except OSError:
            pass

    def _target(self, path: str) -> dict[str, Any] | None:
        if path == "gateway":
            return {"response_format": "json"}  # what vllm serve is asked for too: no log-probabilities
        if path == "gateway-verbose":
            return {"response_format": "verbose_json"}  # top-5 log-probabilities per token, segment stats
        if path == MULTIPROCESS_PATH and self.mp is not None:
            return {"url": self.mp.url, "token": self.mp.token, "response_format": "json"}
        if path == "vllm-serve" and self.serve is not None:
            return {"url": self.serve.url, "token": None, "kind": "vllm", "model": self.serve_model, "stream": False}
        raise ValueError(f"no HTTP target for path {path}")


#: The paths served by the one gateway-mp process group.
MP_PATHS = (MULTIPROCESS_PATH, MULTIPROCESS_DIRECT_PATH)


def _logprobs(path: str) -> int | None:
    return 5 if path == "direct-top5" else None


def _without(cell: Cell, path: str) -> Cell:
    return replace(cell, paths=tuple(p for p in cell.paths if p != path))


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: vllm serve is stopped, results saved


def run_throughput(args: Any, cells: list[Cell], out_path: Path) -> dict[str, Any]:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # `timeout` on the device sends SIGTERM first
    bench = ThroughputBench(args, cells, out_path)
    with _runner() as runner:
        return runner.run(bench.run())
