"""The engine workloads: one vLLM engine, measured through the gateway and directly.

One process holds everything on one event loop: the gateway app (``create_app``)
served by uvicorn on 127.0.0.1, and through its lifespan the one
``VllmTranscriptionEngine`` (vLLM's ``AsyncLLMEngine``). For each cell:

* ``direct``: the same engine object's ``generate`` is called from this loop with
  the decoded samples, exactly the request the gateway would build;
* ``gateway``: a separate client process (``bench.client``) posts the WAV files
  over HTTP on loopback, with the admin-only ``ignore_eos=true`` and
  ``max_completion_tokens``;
* ``raw`` (the 12 s, one-stream cell only): vLLM's ``AsyncLLM.generate`` with
  final-only output, without the adapter, to show what the adapter itself costs;
* ``direct-final`` (opt-in, ``--add-path direct-final``): like ``direct`` but with
  ``stream_deltas=False`` (vLLM ``FINAL_ONLY``), the engine request the gateway
  builds for unstreamed short passes since 8cbdcd9; ``direct`` keeps per-token
  ``DELTA`` updates, as before.

The gateway opens only on a passing qualification (the real one, on the GPU,
against the Transformers reference) unless ``--allow-unqualified`` is given; then
a harness-only hook opens it with qualification id ``bench-unqualified`` and the
results say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import envinfo
from bench.stats import add_overheads, summarize
from bench.workloads import Cell, describe_cell, noise_pcm16, pcm16_to_float, write_wav

logger = logging.getLogger("bench")

UNQUALIFIED_ID = "bench-unqualified"
REPO_ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Sampler:
    """Peak device memory (NVML) and peak vLLM KV-cache usage, per measured window."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handle: Any = None
        self._kv: Any = None
        self.window: dict[str, float] = {}
        self.overall: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception:
            self._nvml = None

    def _kv_usage(self) -> float | None:
        if self._kv is None:
            from prometheus_client import REGISTRY

            names = getattr(REGISTRY, "_names_to_collectors", {})
            self._kv = names.get("vllm:kv_cache_usage_perc") or names.get("vllm:gpu_cache_usage_perc") or False
        if not self._kv:
            return None
        values = [s.value for family in self._kv.collect() for s in family.samples]
        return max(values) if values else None

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self._nvml is not None:
            try:
                out["gpu_used_bytes"] = float(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
            except Exception:
                pass
        kv = self._kv_usage()
        if kv is not None:
            out["kv_usage"] = float(kv)
        return out

    def _note(self, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.window[key] = max(self.window.get(key, value), value)
            self.overall[key] = max(self.overall.get(key, value), value)

    async def _run(self) -> None:
        while True:
            self._note(self.read())
            await asyncio.sleep(0.25)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def begin(self) -> None:
        self.window = {}
        self._note(self.read())

    def end(self) -> dict[str, float]:
        self._note(self.read())
        return dict(self.window)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


class EngineBench:
    """Owns the gateway, its engine and the measured cells."""

    def __init__(self, args: Any, cells: list[Cell], out_path: Path) -> None:
        self.args = args
        self.cells = cells
        self.out_path = out_path
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.work = Path(tempfile.mkdtemp(prefix="moss-bench-", dir=args.work_dir))
        self.seed = int(args.seed)
        self.sampler = Sampler()
        self.result: dict[str, Any] = {
            "kind": "engine",
            "workloads": args.workload,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "argv": sys.argv,
            "environment": envinfo.environment(),
            "cells": [],
            "rows": [],
            "records": {},
            "skipped": [],
        }
        self.started = time.monotonic()
        self.ready = asyncio.Event()
        self.gate_note: dict[str, Any] = {}
        self.paced_ms = getattr(args, "paced_engine_ms", None)
        from bench.paced import Profiler

        profile = getattr(args, "profile", None)
        self.profiler = Profiler(Path(profile) if profile else None)
        if self.paced_ms:
            self.result["engine_kind"] = f"paced stand-in, {self.paced_ms} ms per step (no model)"

    # -- settings and start-up -------------------------------------------------
    def settings(self) -> Any:
        from service.settings import GatewaySettings

        a = self.args
        engine: dict[str, Any] = {
            "dtype": a.dtype,
            "max_num_seqs": a.max_num_seqs,
            "kv_cache_dtype": a.kv_cache_dtype,
            "gpu_memory_utilization": a.gpu_memory_utilization,
            "enforce_eager": a.enforce_eager,
        }
        if a.model:
            engine["model"] = str(a.model)
        for key in ("max_model_len", "max_num_batched_tokens", "kv_cache_memory_bytes"):
            if getattr(a, key) is not None:
                engine[key] = getattr(a, key)
        audio: dict[str, Any] = {"max_upload_bytes": 1 << 30}
        if a.max_duration_s is not None:
            audio["max_duration_s"] = a.max_duration_s
        qualification: dict[str, Any] = {
            "qualify_on_start": bool(a.qualify),
            "reference_device": a.reference_device,
            "reference_dtype": a.reference_dtype,
        }
        extra: dict[str, Any] = {}
        if getattr(a, "max_concurrent_requests", None) is not None:
            slots = int(a.max_concurrent_requests)
            extra["limits"] = {"max_concurrent_requests": slots, "max_queued_requests": max(64, slots)}
        return GatewaySettings(
            **extra,
            state_dir=Path(a.state_dir),
            cache_dir=Path(a.cache_dir) if a.cache_dir else None,
            server={"host": "127.0.0.1", "port": self.port, "admin_token": self.token, "log_level": "warning"},
            engine=engine,
            audio=audio,
            qualification=qualification,
        )

    async def on_ready(self, state: Any) -> None:
        """The gateway's own gate logic, then (only if asked) the bench-only opening."""
        from service.gate import apply_records, open_gate_from_records, resolve_backend_identity

        if self.paced_ms:  # no model, nothing to qualify: the gate opens for the measurement only
            state.gate.fingerprint = "paced-stand-in"
            self.gate_note.update(qualified=False, opened_by_bench=True, reason="paced stand-in engine")
            state.gate.open, state.gate.qualification_id, state.gate.verdict = True, UNQUALIFIED_ID, "unqualified"
            self.ready.set()
            return
        try:
            if self.args.qualify:
                await open_gate_from_records(state)
            else:
                await resolve_backend_identity(state)
                apply_records(state)
        except Exception as exc:
            logger.exception("the gate step failed")
            self.gate_note["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            self.gate_note["qualified"] = bool(state.gate.open)
            self.gate_note["reason"] = state.gate.reason
            self.gate_note["qualification_id"] = state.gate.qualification_id
            self.gate_note["verdict"] = state.gate.verdict
            if not state.gate.open and self.args.allow_unqualified:
                logger.warning(
                    "gate closed (%s): opening it for the benchmark only as %s", state.gate.reason, UNQUALIFIED_ID
                )
                self.gate_note["opened_by_bench"] = True
                state.gate.open = True
                state.gate.qualification_id = UNQUALIFIED_ID
                state.gate.verdict = "unqualified"
                state.gate.reason = (
                    "opened by the benchmark harness (bench/harness.py) without a passing qualification; "
                    "benchmark use only"
                )
            self.ready.set()

    async def wait_ready(self, state: Any, timeout_s: float) -> None:
        from service.state import EngineStatus

        deadline = time.monotonic() + timeout_s
        while not self.ready.is_set():
            if state.engine_status is EngineStatus.FAILED:
                raise RuntimeError(f"the engine failed to start: {state.engine_error}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gateway was not ready within {timeout_s:.0f} s")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.ready.wait(), 1.0)

    # -- the run ---------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        import httpx
        import uvicorn

        from service.app import create_app

        settings = self.settings()
        factory = None
        if self.paced_ms:
            from bench.paced import paced_factory

            factory = paced_factory(float(self.paced_ms))
        app = create_app(settings, engine_factory=factory, on_ready=self.on_ready)
        state = app.state.gateway
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False, lifespan="on"
        )
        server = uvicorn.Server(config)
        t0 = time.monotonic()
        serve_task = asyncio.create_task(server.serve())
        try:
            await self.wait_ready(state, self.args.start_timeout_s)
            self.result["startup_s"] = {
                "engine_load_s": getattr(state.engine, "load_time_s", None),
                "ready_s": time.monotonic() - t0,
            }
            async with httpx.AsyncClient(timeout=60) as client:
                self.result["ready"] = (await client.get(f"{self.url}/ready")).json()
                self.result["backend"] = (await client.get(f"{self.url}/v1/backend")).json()
            self.result["gate"] = dict(self.gate_note)
            self.result["qualification"] = self._qualification_summary(state)
            self.result["engine"] = {
                "describe": state.engine.describe(),
                "kv_bytes_per_token_bf16": getattr(state.engine, "kv_bytes_per_token_bf16", None),
                "kv_cache_tokens": _kv_cache_tokens(state.engine),
                "max_model_len": state.engine.max_model_len,
            }
            self.result["settings"] = json.loads(settings.model_dump_json(exclude={"server": {"admin_token"}}))
            self._save()
            logger.info("ready in %.1f s; gate %s", time.monotonic() - t0, self.gate_note)
            self.sampler.start()
            for cell in self.cells:
                remaining = self.args.deadline_s - (time.monotonic() - self.started)
                estimate = self.estimate_cell_s(cell)
                if estimate > remaining:
                    note = f"{cell.name}: skipped, about {estimate:.0f} s needed and {remaining:.0f} s left"
                    logger.warning(note)
                    self.result["skipped"].append(note)
                    continue
                await self.run_cell(state, cell)
                self._save()
        except BaseException as exc:
            self.result["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            await self.sampler.stop()
            self.profiler.dump()
            self.result["memory_overall_peak"] = dict(self.sampler.overall)
            self.result["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            self.result["elapsed_s"] = time.monotonic() - self.started
            self._save()
            server.should_exit = True
            try:
                await asyncio.wait_for(serve_task, 30)
            except (TimeoutError, Exception) as exc:  # the results are already saved
                logger.warning("gateway shutdown did not finish cleanly: %r", exc)
        return self.result

    def estimate_cell_s(self, cell: Cell) -> float:
        return estimate_cell_s(cell)

    def _qualification_summary(self, state: Any) -> dict[str, Any] | None:
        from qualification.records import RecordStore

        store = RecordStore(
            state.settings.state_dir / "qualification", key_path=state.settings.qualification.record_key_path
        )
        latest = None
        for check in store.all():
            record = check.record
            if record is None or record.get("fingerprint") != state.gate.fingerprint:
                continue
            if latest is None or str(record.get("created_at")) > str(latest.get("created_at")):
                latest = record
        if latest is None:
            return None
        return {
            "qualification_id": latest.get("qualification_id"),
            "created_at": latest.get("created_at"),
            "verdict": latest.get("verdict"),
            "comparison": latest.get("comparison"),
            "reference_tokens": len((latest.get("reference") or {}).get("token_ids") or []),
            "candidate_tokens": len((latest.get("candidate") or {}).get("token_ids") or []),
            "top2_at_divergence": (latest.get("reference") or {}).get("top2_at_divergence"),
        }

    def _save(self) -> None:
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, indent=1, default=str))
        os.replace(tmp, self.out_path)

    # -- one cell ----------------------------------------------------------------
    def _audio(self, cell: Cell, count: int) -> list[np.ndarray]:
        pcms = []
        for _ in range(count):
            self.seed += 1
            pcms.append(noise_pcm16(cell.duration_s, self.seed))
        return pcms

    async def run_cell(self, state: Any, cell: Cell) -> None:
        from service.prompt import build_instruction

        logger.info("cell %s", describe_cell(cell))
        instruction = build_instruction(None, ())
        engine = state.engine
        blocks = 2 if cell.concurrency == 1 and cell.requests_per_worker >= 4 else 1
        per_block = cell.requests_per_worker // blocks
        cell_dir = self.work / cell.name
        cell_dir.mkdir(parents=True, exist_ok=True)
        cell_result: dict[str, Any] = {"cell": cell.as_dict(), "blocks": blocks, "paths": {}}
        t_cell = time.monotonic()

        # warm-up: one request of this shape per path (kernels, allocator, graphs)
        warm = self._audio(cell, 2)
        if "direct" in cell.paths or "raw" in cell.paths or "direct-final" in cell.paths:
            await direct_block(engine, [pcm16_to_float(warm[0])], 1, 1, cell.warmup_tokens, instruction)
        if "gateway" in cell.paths:
            path = write_wav(cell_dir / "warmup.wav", warm[1])
            await self.gateway_block(cell, [path], 1, 1, cell.warmup_tokens, "warmup")

        paths = [p for p in cell.paths if not (self.paced_ms and p == "raw")]
        collected: dict[str, dict[str, Any]] = {p: {"wall_s": 0.0, "records": [], "memory": {}} for p in paths}
        for block in range(blocks):
            for path_name in paths:
                n = cell.concurrency * per_block
                pcms = self._audio(cell, n)
                self.sampler.begin()
                cpu_started = time.process_time()
                if path_name == "gateway":
                    files = [write_wav(cell_dir / f"b{block}-{i}.wav", pcm) for i, pcm in enumerate(pcms)]
                    with self.profiler:
                        wall, records = await self.gateway_block(
                            cell, files, cell.concurrency, per_block, cell.output_tokens, f"b{block}"
                        )
                    self.profiler.requests += len(records)
                    for f in files:
                        f.unlink(missing_ok=True)
                elif path_name in ("direct", "direct-final"):
                    audios = [pcm16_to_float(p) for p in pcms]
                    wall, records = await direct_block(
                        engine,
                        audios,
                        cell.concurrency,
                        per_block,
                        cell.output_tokens,
                        instruction,
                        stream_deltas=path_name == "direct",
                    )
                elif path_name == "raw":
                    audios = [pcm16_to_float(p) for p in pcms]
                    wall, records = await self.raw_block(
                        engine, audios, cell.concurrency, per_block, cell.output_tokens, instruction
                    )
                else:
                    raise ValueError(f"unknown path {path_name}")
                memory = self.sampler.end()
                entry = collected[path_name]
                entry["cpu_s"] = entry.get("cpu_s", 0.0) + (time.process_time() - cpu_started)
                entry["wall_s"] += wall
                entry["records"].extend(records)
                for key, value in memory.items():
                    entry["memory"][key] = max(entry["memory"].get(key, value), value)
                logger.info("  %s block %d: %d requests in %.3f s", path_name, block, len(records), wall)

        for path_name, entry in collected.items():
            row = summarize(cell, path_name, entry["wall_s"], entry["records"])
            row["peak_gpu_used_bytes"] = entry["memory"].get("gpu_used_bytes")
            row["peak_kv_usage"] = entry["memory"].get("kv_usage")
            # CPU seconds of this (gateway + engine front-end) process per request, all threads
            row["process_cpu_ms_per_request"] = 1000.0 * entry.get("cpu_s", 0.0) / max(1, len(entry["records"]))
            kv_tokens = self.result["engine"].get("kv_cache_tokens")
            if kv_tokens and row["peak_kv_usage"] is not None:
                row["peak_kv_tokens"] = int(row["peak_kv_usage"] * kv_tokens)
            self.result["rows"].append(row)
            self.result["records"][f"{cell.name}/{path_name}"] = entry["records"]
            cell_result["paths"][path_name] = {"wall_s": entry["wall_s"], "requests": len(entry["records"])}
        add_overheads(self.result["rows"])
        cell_result["elapsed_s"] = time.monotonic() - t_cell
        self.result["cells"].append(cell_result)
        with contextlib.suppress(OSError):
            for leftover in cell_dir.iterdir():
                leftover.unlink()
            cell_dir.rmdir()

    async def raw_block(
        self,
        engine: Any,
        audios: list[np.ndarray],
        concurrency: int,
        per_worker: int,
        max_tokens: int,
        instruction: str,
    ) -> tuple[float, list[dict[str, Any]]]:
        """vLLM alone: the adapter's AsyncLLM with final-only output (no per-token updates)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        llm = engine._engine  # the adapter's AsyncLLMEngine (bench-only access)
        records: list[dict[str, Any]] = []

        async def one(index: int) -> None:
            params = SamplingParams(
                max_tokens=max_tokens, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY
            )
            prompt = {
                "prompt_token_ids": engine.prompt_token_ids(instruction),  # what the adapter sends
                "multi_modal_data": {"audio": (audios[index], engine.sample_rate)},
            }
            started = time.perf_counter()
            final = None
            async for output in llm.generate(prompt, params, f"bench-raw-{uuid.uuid4().hex[:16]}"):
                final = output
            done = time.perf_counter()
            records.append(
                {
                    "index": index,
                    "status": 200 if final is not None else 500,
                    "t_start": started,
                    "t_end": done,
                    "latency_s": done - started,
                    "ttft_s": None,
                    "generated_tokens": None if final is None else len(final.outputs[0].token_ids),
                    "prompt_tokens": None if final is None else len(final.prompt_token_ids or ()),
                }
            )

        return await closed_loop(one, records, concurrency, per_worker)

    async def gateway_block(
        self,
        cell: Cell,
        files: list[Path],
        concurrency: int,
        per_worker: int,
        max_tokens: int,
        label: str,
        *,
        target: dict[str, Any] | None = None,
    ) -> tuple[float, list[dict[str, Any]]]:
        """The HTTP client process against the gateway (or, with `target`, another server: url, kind...)."""
        spec: dict[str, Any] = {
            "url": self.url,
            "token": self.token,
            "files": [str(f) for f in files],
            "concurrency": concurrency,
            "requests_per_worker": per_worker,
            "output_tokens": max_tokens,
            "stream": cell.stream,
            **(target or {}),
        }
        spec_path = self.work / f"{cell.name}-{label}-spec.json"
        out_path = self.work / f"{cell.name}-{label}-out.json"
        spec_path.write_text(json.dumps(spec))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.client",
            str(spec_path),
            str(out_path),
            cwd=str(REPO_ROOT),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"bench.client failed ({process.returncode}): {output.decode(errors='replace')[-3000:]}")
        if output.strip():
            logger.warning("client: %s", output.decode(errors="replace").strip()[-1500:])
        result = json.loads(out_path.read_text())
        spec_path.unlink(missing_ok=True)
        out_path.unlink(missing_ok=True)
        return float(result["wall_s"]), result["records"]


def _kv_cache_tokens(engine: Any) -> int | None:
    config = getattr(engine, "vllm_config", None)
    cache = getattr(config, "cache_config", None)
    blocks = getattr(cache, "num_gpu_blocks", None)
    size = getattr(cache, "block_size", None)
    if blocks and size:
        return int(blocks) * int(size)
    return None


def estimate_cell_s(cell: Cell) -> float:
    """A generous guess of a cell's time on the H200 (used to skip what cannot finish in time).

    Per decode step: about 1.9 ms at one stream, more per extra stream and per token of
    context read (fitted by eye to bench-host.md's plain-script figures), plus prefill."""
    from bench.workloads import audio_tokens

    prompt = audio_tokens(cell.duration_s) * 1.06 + 60
    context = prompt + cell.output_tokens / 2.0
    step = 0.0019 + 0.0001 * (cell.concurrency - 1) + 2.5e-8 * cell.concurrency * context
    prefill = 0.05 + cell.concurrency * prompt * 2.0e-5
    per_wave = prefill + cell.output_tokens * step
    warmup = prefill / cell.concurrency + cell.warmup_tokens * 0.002
    return 1.25 * len(cell.paths) * (cell.requests_per_worker * per_wave + warmup) + 3.0


def run_engine_bench(args: Any, cells: list[Cell], out_path: Path) -> dict[str, Any]:
    bench = EngineBench(args, cells, out_path)
    runner = _runner()
    with runner:
        return runner.run(bench.run())


def _runner() -> asyncio.Runner:
    """uvloop when it is installed (as uvicorn would pick it), else the default loop."""
    try:
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        return asyncio.Runner()


async def direct_block(
    engine: Any,
    audios: list[np.ndarray],
    concurrency: int,
    per_worker: int,
    max_tokens: int,
    instruction: str,
    *,
    stream_deltas: bool = True,
    want_logprobs: int | None = None,
) -> tuple[float, list[dict[str, Any]]]:
    """The direct path: the engine object's `generate` with the engine request the gateway builds, closed loop."""
    from service.engine.protocol import GenerationRequest

    records: list[dict[str, Any]] = []

    async def one(index: int) -> None:
        request = GenerationRequest(
            request_id=f"bench-direct-{uuid.uuid4().hex[:16]}",
            audio=audios[index],
            instruction=instruction,
            max_tokens=max_tokens,
            ignore_eos=True,
            stream_deltas=stream_deltas,
            want_logprobs=want_logprobs,
        )
        started = time.perf_counter()
        first = None
        final = None
        async for update in engine.generate(request):
            if first is None and update.token_ids_delta:
                first = time.perf_counter()
            if update.finished:
                final = update
        done = time.perf_counter()
        ttft = None if first is None else first - started
        timings = getattr(final, "timings", None)
        if not stream_deltas and timings is not None and timings.first_token and timings.submitted:
            # one final output only: the adapter's timer (the engine's own arrival-to-first-token)
            ttft = timings.first_token - timings.submitted
        records.append(
            {
                "index": index,
                "status": 200 if final is not None else 500,
                "t_start": started,
                "t_end": done,
                "latency_s": done - started,
                "ttft_s": ttft,
                "generated_tokens": None if final is None else len(final.all_token_ids),
                "prompt_tokens": None if final is None else final.prompt_token_count,
                "finish_reason": None if final is None else final.finish_reason,
            }
        )

    return await closed_loop(one, records, concurrency, per_worker)


async def closed_loop(
    one: Callable[[int], Awaitable[None]], records: list[dict[str, Any]], concurrency: int, per_worker: int
) -> tuple[float, list[dict[str, Any]]]:
    """`concurrency` streams of `per_worker` requests each, back to back; wall time and the sorted records."""

    async def worker(w: int) -> None:
        for k in range(per_worker):
            await one(w * per_worker + k)

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - started
    records.sort(key=lambda r: r["index"])
    return wall, records
