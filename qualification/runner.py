"""One qualification: reference run, candidate runs, verdict, sealed record.

Run by the gateway itself (admin endpoint, or at start-up) or by the standalone
`moss-gateway qualify --standalone`, always against the very engine that serves:
the candidate token IDs come from that engine, the comparison and the record are
made here, so a verdict cannot be forged from outside.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from qualification.parity import ParityResult, StepTop2, compare_runs
from qualification.records import RecordStore, canonical_json
from service.engine.protocol import GenerationRequest, TranscriptionEngine
from service.evidence import classify_stop
from service.ledger import write_json_atomic
from service.prompt import build_instruction, build_prompt
from service.settings import QualificationSettings

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Clip:
    samples: np.ndarray
    sha256_file: str
    sha256_samples: str
    duration_s: float
    name: str


def load_clip(path: Path) -> Clip:
    from service.audio import decode_audio

    data = path.read_bytes()
    audio = decode_audio(data, filename=path.name)
    return Clip(
        samples=audio.samples,
        sha256_file=hashlib.sha256(data).hexdigest(),
        sha256_samples=audio.sha256,
        duration_s=audio.duration_s,
        name=path.name,
    )


def batch_companions(samples: np.ndarray, count: int) -> list[np.ndarray]:
    """Other audio for the batch-invariance run: deterministic variations of the clip."""
    rng = np.random.default_rng(1234)
    variants: list[np.ndarray] = []
    for index in range(count):
        kind = index % 4
        if kind == 0:
            variant = samples[::-1].copy()
        elif kind == 1:
            variant = np.roll(samples, 8000 * (index + 1)) * 0.7
        elif kind == 2:
            variant = (rng.standard_normal(len(samples)) * 0.05).astype(np.float32)
        else:
            variant = np.concatenate([samples[: len(samples) // 2], samples]) * 0.9
        variants.append(np.asarray(variant, dtype=np.float32))
    return variants


async def run_reference_subprocess(
    *, model_dir: Path, clip: Clip, instruction: str, settings: QualificationSettings, cache_dir: Path, progress: Progress
) -> dict[str, Any]:
    """The Transformers reference, cached by reference identity, clip, prompt and budget."""
    from qualification.reference import reference_identity

    identity = reference_identity(model_dir, dtype=settings.reference_dtype, device=settings.reference_device)
    key = hashlib.sha256(
        canonical_json(
            {
                "identity": identity,
                "clip": clip.sha256_samples,
                "prompt": build_prompt(instruction),
                "max_new_tokens": settings.max_new_tokens,
            }
        )
    ).hexdigest()
    cached = cache_dir / f"{key}.json"
    if cached.is_file():
        progress(f"reference: cached result {key[:12]} reused")
        result = json.loads(cached.read_text())
        result["cached"] = True
        return result
    progress("reference: running Transformers generate (child process)")
    with tempfile.TemporaryDirectory(prefix="moss-ref-") as tmp:
        audio_path = Path(tmp) / "clip.npy"
        out_path = Path(tmp) / "reference.json"
        np.save(audio_path, clip.samples)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "qualification.reference",
            "--model", str(model_dir), "--audio", str(audio_path), "--instruction", instruction,
            "--max-new-tokens", str(settings.max_new_tokens), "--dtype", settings.reference_dtype,
            "--device", settings.reference_device, "--out", str(out_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            cwd=str(Path(__file__).resolve().parent.parent),
        )
        output, _ = await process.communicate()
        if process.returncode != 0:
            tail = output.decode(errors="replace")[-2000:]
            raise RuntimeError(f"the reference run failed (exit {process.returncode}): {tail}")
        result = json.loads(out_path.read_text())
    result["cache_key"] = key
    write_json_atomic(cached, result)
    result["cached"] = False
    progress(f"reference: {len(result['token_ids'])} tokens, stop {result['stop']}")
    return result


async def run_candidate(engine: TranscriptionEngine, audio: np.ndarray, instruction: str, max_tokens: int) -> dict[str, Any]:
    """One greedy run on the serving engine, with its stop classified like any request's."""
    request = GenerationRequest(
        request_id=f"qualify-{uuid.uuid4().hex[:12]}", audio=audio, instruction=instruction, max_tokens=max_tokens
    )
    final = None
    started = time.monotonic()
    async for update in engine.generate(request):
        if update.finished:
            final = update
    if final is None:
        raise RuntimeError("the engine ended the qualification run without a final output")
    stop = classify_stop(
        finish_reason=final.finish_reason,
        stop_reason=final.stop_reason,
        token_ids=final.all_token_ids,
        eos_token_ids=engine.eos_token_ids,
        max_tokens=max_tokens,
        prompt_tokens=final.prompt_token_count,
        max_model_len=engine.max_model_len,
    )
    timings = final.timings
    ttft = timings.time_to_first_token_s if timings else None
    decode_s = timings.decode_time_s if timings else None
    n = len(final.all_token_ids)
    return {
        "token_ids": final.all_token_ids,
        "text": final.text,
        "stop": stop.stop,
        "finish_reason": final.finish_reason,
        "stop_reason": final.stop_reason,
        "prompt_tokens": final.prompt_token_count,
        "timings": {
            "prefill_s": None if ttft is None else round(ttft, 4),
            "decode_tokens_per_s": round((n - 1) / decode_s, 3) if decode_s and n > 1 else None,
            "total_s": round(time.monotonic() - started, 4),
        },
    }


def _compare(reference: dict[str, Any], candidate: dict[str, Any], settings: QualificationSettings, token_text: Callable[[int], str]) -> ParityResult:
    return compare_runs(
        reference_ids=reference["token_ids"],
        reference_stop=reference["stop"],
        reference_top2=[StepTop2(int(a), float(b), int(c), float(d)) for a, b, c, d in reference["top2"]],
        candidate_ids=candidate["token_ids"],
        candidate_stop=candidate["stop"],
        policy=settings.policy,
        tolerance=settings.margin_tolerance,
        relative_tolerance=settings.margin_relative_tolerance,
        token_text=token_text,
    )


def _device_peak_bytes() -> int | None:
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.max_memory_allocated())
    except ImportError:
        pass
    return None


async def qualify(
    *,
    engine: TranscriptionEngine,
    identity: dict[str, Any],
    fingerprint: str,
    model_dir: Path,
    state_dir: Path,
    settings: QualificationSettings,
    clip_path: Path,
    instruction: str | None = None,
    engine_load_s: float | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the whole qualification and write its sealed record; returns the record."""
    say = progress or (lambda message: logger.info("qualify: %s", message))
    instruction = build_instruction(instruction)
    clip = load_clip(clip_path)
    say(f"clip {clip.name}: {clip.duration_s:.2f} s, sha256 {clip.sha256_file[:12]}")
    store = RecordStore(state_dir / "qualification")
    reference = await run_reference_subprocess(
        model_dir=settings.reference_model or model_dir, clip=clip, instruction=instruction, settings=settings,
        cache_dir=store.root / "reference-cache", progress=say,
    )
    say("candidate: single request on the serving engine")
    candidate = await run_candidate(engine, clip.samples, instruction, settings.max_new_tokens)
    single = _compare(reference, candidate, settings, engine.token_text)
    say(f"candidate: {single.verdict} ({single.explanation})")

    say(f"batch: the clip among {settings.batch_size} concurrent requests")
    companions = batch_companions(clip.samples, settings.batch_size - 1)
    runs = await asyncio.gather(
        run_candidate(engine, clip.samples, instruction, settings.max_new_tokens),
        *(run_candidate(engine, audio, instruction, settings.max_new_tokens) for audio in companions),
    )
    batched = _compare(reference, runs[0], settings, engine.token_text)
    say(f"batch: {batched.verdict} ({batched.explanation})")

    device = identity.get("runtime", {}).get("accelerator", {}).get("kind", "cpu")
    body = {
        "qualification_id": f"q-{uuid.uuid4().hex[:16]}",
        "created_at": datetime.now(UTC).isoformat(),
        "fingerprint": fingerprint,
        "identity": identity,
        "clip": {
            "name": clip.name, "sha256": clip.sha256_file, "samples_sha256": clip.sha256_samples,
            "duration_s": round(clip.duration_s, 3),
        },
        "prompt": {"instruction": instruction, "text": build_prompt(instruction)},
        "decoding": {"greedy": True, "temperature": 0.0, "max_new_tokens": settings.max_new_tokens},
        "reference": {
            "identity": reference["identity"],
            "token_ids": reference["token_ids"],
            "text": reference["text"],
            "stop": reference["stop"],
            "generation_config": reference["generation_config"],
            "cache_key": reference.get("cache_key"),
            "top2_at_divergence": None,
        },
        "candidate": {k: candidate[k] for k in ("token_ids", "text", "stop", "finish_reason", "stop_reason")},
        "batched": {
            "batch_size": settings.batch_size,
            "clip_run": {k: runs[0][k] for k in ("token_ids", "text", "stop", "finish_reason", "stop_reason")},
            "companion_generated_tokens": [len(run["token_ids"]) for run in runs[1:]],
            "parity": batched.as_dict(),
        },
        "verdict": {
            "result": single.verdict,
            "policy": settings.policy,
            "tolerance": settings.margin_tolerance,
            "relative_tolerance": settings.margin_relative_tolerance,
            "passed": single.passed,
            "batched_result": batched.verdict,
            "batched_passed": batched.passed,
            "evidence": single.as_dict(),
        },
        "comparison": {
            "label": "diagnostic (CPU)" if device == "cpu" else f"{device} backend comparison",
            "reference": {
                **reference["timings"], **reference["memory"],
                "prompt_tokens": reference.get("prompt_tokens"), "generated_tokens": len(reference["token_ids"]),
                "cached": reference.get("cached", False),
            },
            "candidate": {
                "load_s": None if engine_load_s is None else round(engine_load_s, 3),
                **candidate["timings"],
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "device_peak_bytes": _device_peak_bytes(),
                "prompt_tokens": candidate["prompt_tokens"], "generated_tokens": len(candidate["token_ids"]),
            },
        },
    }
    divergence = single.first_divergence
    if divergence is not None and divergence.position < len(reference["top2"]):
        body["reference"]["top2_at_divergence"] = reference["top2"][divergence.position]
    path = await asyncio.to_thread(store.write, body)
    say(f"record {body['qualification_id']} written to {path} (pid {os.getpid()})")
    return {**body, "path": str(path)}
