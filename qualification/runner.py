"""One qualification: reference run, candidate runs, verdict, sealed record.

Run by the gateway itself (admin endpoint, or at start-up) or by the standalone
`moss-gateway qualify --standalone`, always against the very engine that serves:
the candidate token IDs come from that engine, the comparison and the record are
made here, so a verdict cannot be forged from outside.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import importlib.metadata
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

from qualification.parity import ForcedStep, ParityResult, compare_runs
from qualification.records import RecordStore, canonical_json
from qualification.reference import REFERENCE_CODE_PATH
from service.engine.protocol import GenerationRequest, TranscriptionEngine
from service.evidence import classify_stop
from service.identity import checkpoint_identity, file_hash
from service.ledger import write_json_atomic
from service.prompt import PROMPT_CODE_PATH, PROMPT_TEMPLATE, build_instruction, build_prompt
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


def reference_identity(
    *, model_dir: Path, backend_identity: dict[str, Any], engine_model_dir: Path, settings: QualificationSettings
) -> dict[str, Any]:
    """What can change the reference's output: its stack and every file hash of its checkpoint.

    The hashes are the backend identity's own (weights, configs, tokenizer,
    processor, generation config, remote code) when the reference loads the
    engine's checkpoint; a separate reference checkpoint is hashed by the same
    memoised `checkpoint_identity`, so no file is hashed twice.
    """
    if model_dir.resolve() == engine_model_dir.resolve() and "checkpoint" in backend_identity:
        checkpoint = backend_identity["checkpoint"]
    else:
        checkpoint = checkpoint_identity(model_dir, revision=None)
    runtime = backend_identity.get("runtime", {})
    return {
        "transformers": runtime.get("transformers") or importlib.metadata.version("transformers"),
        "torch": (runtime.get("torch") or {}).get("version"),
        "checkpoint": checkpoint,
        "code_sha256": {path.name: file_hash(path) for path in (REFERENCE_CODE_PATH, PROMPT_CODE_PATH)},
        "dtype": settings.reference_dtype,
        "device": settings.reference_device,
    }


async def _reference_child(
    *, model_dir: Path, clip: Clip, instruction: str, settings: QualificationSettings, extra: list[str]
) -> dict[str, Any]:
    """`python -m qualification.reference` on the clip; its JSON result."""
    with tempfile.TemporaryDirectory(prefix="moss-ref-") as tmp:
        audio_path = Path(tmp) / "clip.npy"
        out_path = Path(tmp) / "reference.json"
        np.save(audio_path, clip.samples)
        arguments = [
            "--model", str(model_dir), "--audio", str(audio_path), "--instruction", instruction,
            "--max-new-tokens", str(settings.max_new_tokens), "--dtype", settings.reference_dtype,
            "--device", settings.reference_device, "--out", str(out_path),
        ]
        for index, value in enumerate(extra):
            if value.startswith("@"):  # a JSON document passed through a file
                path = Path(tmp) / f"arg{index}.json"
                path.write_text(value[1:])
                value = str(path)
            arguments.append(value)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "qualification.reference", *arguments,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            cwd=str(Path(__file__).resolve().parent.parent),
        )
        output, _ = await process.communicate()
        if process.returncode != 0:
            tail = output.decode(errors="replace")[-2000:]
            raise RuntimeError(f"the reference run failed (exit {process.returncode}): {tail}")
        result: dict[str, Any] = json.loads(out_path.read_text())
        return result


def reference_cache_key(*, identity: dict[str, Any], clip: Clip, instruction: str, max_new_tokens: int) -> str:
    return hashlib.sha256(
        canonical_json(
            {
                "identity": identity,
                "clip": clip.sha256_samples,
                "template": PROMPT_TEMPLATE,
                "instruction": instruction,
                "max_new_tokens": max_new_tokens,
            }
        )
    ).hexdigest()


def read_cached_reference(store: RecordStore, path: Path, key: str) -> dict[str, Any] | None:
    """A cached reference run, only if it is sealed with the gate's key and made for `key`."""
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        logger.warning("cached reference %s unreadable (%s): running the reference again", path.name, exc)
        return None
    body = store.verify(document)
    if body is None:
        logger.warning("cached reference %s: seal mismatch (altered or foreign); running the reference again", path.name)
        return None
    if body.get("cache_key") != key:
        logger.warning("cached reference %s was made for another key; running the reference again", path.name)
        return None
    return body


async def run_reference_subprocess(
    *,
    model_dir: Path,
    clip: Clip,
    instruction: str,
    settings: QualificationSettings,
    store: RecordStore,
    identity: dict[str, Any],
    progress: Progress,
) -> dict[str, Any]:
    """The Transformers reference, cached (sealed) by its identity, clip, prompt and budget."""
    key = reference_cache_key(
        identity=identity, clip=clip, instruction=instruction, max_new_tokens=settings.max_new_tokens
    )
    cached = store.root / "reference-cache" / f"{key}.json"
    result = read_cached_reference(store, cached, key)
    if result is not None:
        progress(f"reference: cached result {key[:12]} reused")
        return {**result, "cached": True}
    progress("reference: running Transformers generate (child process)")
    result = await _reference_child(
        model_dir=model_dir, clip=clip, instruction=instruction, settings=settings, extra=[]
    )
    result["identity"] = identity
    result["cache_key"] = key
    await asyncio.to_thread(write_json_atomic, cached, store.sealed(result))
    progress(f"reference: {len(result['token_ids'])} tokens, stop {result['stop']}")
    return {**result, "cached": False}


async def score_candidates(
    *,
    model_dir: Path,
    clip: Clip,
    instruction: str,
    settings: QualificationSettings,
    sequences: list[list[int]],
    progress: Progress,
) -> dict[tuple[int, ...], list[ForcedStep]]:
    """The reference teacher-forced along each engine sequence that differs from its own run."""
    unique = sorted({tuple(sequence) for sequence in sequences})
    if not unique:
        return {}
    progress(f"reference: teacher-forcing along {len(unique)} diverging engine run(s) (child process)")
    result = await _reference_child(
        model_dir=model_dir, clip=clip, instruction=instruction, settings=settings,
        extra=["--score", "@" + json.dumps([list(sequence) for sequence in unique])],
    )
    return {
        sequence: [ForcedStep(int(top), float(top_lp), float(token_lp)) for top, top_lp, token_lp in scored]
        for sequence, scored in zip(unique, result["scored"], strict=True)
    }


async def run_candidate(
    engine: TranscriptionEngine, audio: np.ndarray, instruction: str, max_tokens: int, *, rank: int | None = None
) -> dict[str, Any]:
    """One greedy run on the serving engine (pinned to a data-parallel rank if given), its stop classified."""
    request = GenerationRequest(
        request_id=f"qualify-{uuid.uuid4().hex[:12]}", audio=audio, instruction=instruction, max_tokens=max_tokens,
        data_parallel_rank=rank,
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
        "prompt_token_ids": final.prompt_token_ids,
        "timings": {
            "prefill_s": None if ttft is None else round(ttft, 4),
            "decode_tokens_per_s": round((n - 1) / decode_s, 3) if decode_s and n > 1 else None,
            "total_s": round(time.monotonic() - started, 4),
        },
    }


def _compare(
    reference: dict[str, Any],
    candidate: dict[str, Any],
    forced: dict[tuple[int, ...], list[ForcedStep]],
    settings: QualificationSettings,
    token_text: Callable[[int], str],
) -> ParityResult:
    result = compare_runs(
        reference_ids=reference["token_ids"],
        reference_stop=reference["stop"],
        candidate_ids=candidate["token_ids"],
        candidate_stop=candidate["stop"],
        forced=forced.get(tuple(candidate["token_ids"])),
        policy=settings.policy,
        margin=settings.near_tie_logprob_margin,
        token_text=token_text,
    )
    engine_prompt = candidate.get("prompt_token_ids")
    if engine_prompt is not None and list(engine_prompt) != list(reference["prompt_ids"]):
        # Parity of outputs means nothing if the two did not read the same prompt.
        return dataclasses.replace(
            result, verdict="failed", passed=False,
            explanation=f"the engine's prompt IDs ({len(engine_prompt)}) differ from the reference's "
            f"({len(reference['prompt_ids'])}); {result.explanation}",
        )
    return result


def _forced_evidence(forced: dict[tuple[int, ...], list[ForcedStep]], token_ids: list[int]) -> list[list[float]] | None:
    """The teacher-forced reference along a diverging run, `[top_id, top_logprob, token_logprob]` per token."""
    steps = forced.get(tuple(token_ids))
    return None if steps is None else [[step.top_id, step.top_logprob, step.token_logprob] for step in steps]


def _device_peak_bytes() -> int | None:
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.max_memory_allocated())
    except ImportError:
        pass
    return None


def rank_pins(data_parallel_size: int) -> list[int | None]:
    """The ranks qualification pins its runs to: each one with data parallelism, else vLLM's choice (None)."""
    return list(range(data_parallel_size)) if data_parallel_size > 1 else [None]


@dataclass
class RankRuns:
    """One data-parallel rank's qualification runs: the clip alone, then among a batch, both on that rank."""

    rank: int | None
    single: dict[str, Any]
    batch: list[dict[str, Any]]
    single_parity: ParityResult | None = None
    batched_parity: ParityResult | None = None

    def compare(
        self,
        reference: dict[str, Any],
        forced: dict[tuple[int, ...], list[ForcedStep]],
        settings: QualificationSettings,
        token_text: Callable[[int], str],
        say: Progress,
    ) -> None:
        self.single_parity = _compare(reference, self.single, forced, settings, token_text)
        self.batched_parity = _compare(reference, self.batch[0], forced, settings, token_text)
        where = "" if self.rank is None else f" (rank {self.rank})"
        say(f"candidate{where}: {self.single_parity.verdict} ({self.single_parity.explanation})")
        say(f"batch{where}: {self.batched_parity.verdict} ({self.batched_parity.explanation})")

    def as_record(self, forced: dict[tuple[int, ...], list[ForcedStep]], devices: Any) -> dict[str, Any]:
        """This rank's part of the record: its devices, both runs and both verdicts."""
        assert self.single_parity is not None and self.batched_parity is not None
        keys = ("token_ids", "text", "stop", "finish_reason", "stop_reason")
        return {
            "rank": self.rank,
            "devices": devices,
            "candidate": {**{k: self.single[k] for k in keys}, "reference_forced": _forced_evidence(forced, self.single["token_ids"])},
            "batched_clip_run": {
                **{k: self.batch[0][k] for k in keys}, "reference_forced": _forced_evidence(forced, self.batch[0]["token_ids"]),
            },
            "verdict": {
                "result": self.single_parity.verdict, "passed": self.single_parity.passed,
                "batched_result": self.batched_parity.verdict, "batched_passed": self.batched_parity.passed,
                "evidence": self.single_parity.as_dict(), "batched_evidence": self.batched_parity.as_dict(),
            },
        }


async def run_rank(
    engine: TranscriptionEngine,
    clip: Clip,
    instruction: str,
    settings: QualificationSettings,
    *,
    rank: int | None,
    sizes: tuple[int, int],
    say: Progress,
) -> RankRuns:
    """The clip alone, then the clip among `batch_size` concurrent requests, all pinned to `rank`."""
    where = "" if rank is None else f" on rank {rank} of {sizes[0]}"
    say(f"candidate: single request on the serving engine{where}")
    single = await run_candidate(engine, clip.samples, instruction, settings.max_new_tokens, rank=rank)
    say(f"batch: the clip among {sizes[1]} concurrent requests{where}")
    companions = batch_companions(clip.samples, settings.batch_size - 1)
    runs = await asyncio.gather(
        *(run_candidate(engine, audio, instruction, settings.max_new_tokens, rank=rank) for audio in [clip.samples, *companions])
    )
    return RankRuns(rank=rank, single=single, batch=list(runs))


#: Worst first: the combined verdict of several ranks is the worst of theirs.
_VERDICT_ORDER = ("failed", "explained", "identical")


def combined_verdict(results: list[ParityResult | None]) -> ParityResult:
    """Every rank's parity as one: the worst rank's result, passed only if every rank passed.

    The worst rank's evidence stands for the whole (a record's top-level fields
    keep their shape); each rank's own evidence is in the record's `ranks`.
    """
    present = [r for r in results if r is not None]
    worst = min(present, key=lambda r: _VERDICT_ORDER.index(r.verdict) if r.verdict in _VERDICT_ORDER else -1)
    if all(r.passed for r in present):
        return worst
    failing = next(r for r in present if not r.passed)
    return failing if worst.passed else worst


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
    store = RecordStore(state_dir / "qualification", key_path=settings.record_key_path)
    reference_dir = settings.reference_model or model_dir
    reference = await run_reference_subprocess(
        model_dir=reference_dir, clip=clip, instruction=instruction, settings=settings, store=store,
        identity=reference_identity(
            model_dir=reference_dir, backend_identity=identity, engine_model_dir=model_dir, settings=settings
        ),
        progress=say,
    )
    sizes = (engine.data_parallel_size, settings.batch_size)
    ranks = [
        await run_rank(engine, clip, instruction, settings, rank=rank, sizes=sizes, say=say)
        for rank in rank_pins(engine.data_parallel_size)
    ]
    diverging = [
        run["token_ids"] for rank in ranks for run in (rank.single, rank.batch[0])
        if run["token_ids"] != reference["token_ids"]
    ]
    forced = await score_candidates(
        model_dir=reference_dir, clip=clip, instruction=instruction, settings=settings, sequences=diverging,
        progress=say,
    )
    for rank in ranks:
        rank.compare(reference, forced, settings, engine.token_text, say)
    candidate, runs = ranks[0].single, ranks[0].batch
    single, batched = combined_verdict([r.single_parity for r in ranks]), combined_verdict([r.batched_parity for r in ranks])

    device = identity.get("runtime", {}).get("accelerator", {}).get("kind", "cpu")
    body: dict[str, Any] = {
        "qualification_id": f"q-{uuid.uuid4().hex[:16]}",
        "created_at": datetime.now(UTC).isoformat(),
        "fingerprint": fingerprint,
        "identity": identity,
        "clip": {
            "name": clip.name, "sha256": clip.sha256_file, "samples_sha256": clip.sha256_samples,
            "duration_s": round(clip.duration_s, 3),
        },
        "prompt": {
            "instruction": instruction,
            "text": build_prompt(instruction),
            "token_ids": reference["prompt_ids"],
            "engine_token_ids_match": candidate.get("prompt_token_ids") == reference["prompt_ids"],
        },
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
        "candidate": {
            **{k: candidate[k] for k in ("token_ids", "text", "stop", "finish_reason", "stop_reason")},
            "reference_forced": _forced_evidence(forced, candidate["token_ids"]),
        },
        "batched": {
            "batch_size": settings.batch_size,
            "clip_run": {
                **{k: runs[0][k] for k in ("token_ids", "text", "stop", "finish_reason", "stop_reason")},
                "reference_forced": _forced_evidence(forced, runs[0]["token_ids"]),
            },
            "companion_generated_tokens": [len(run["token_ids"]) for run in runs[1:]],
            "parity": batched.as_dict(),
        },
        "verdict": {
            "result": single.verdict,
            "policy": settings.policy,
            "near_tie_logprob_margin": settings.near_tie_logprob_margin,
            "passed": single.passed,
            "near_ties": single.near_ties,
            "largest_margin_used": single.largest_margin_used,
            "batched_near_ties": batched.near_ties,
            "batched_largest_margin_used": batched.largest_margin_used,
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
    if engine.data_parallel_size > 1:
        devices = {entry["rank"]: entry["devices"] for entry in await engine.rank_devices()}
        body["ranks"] = [rank.as_record(forced, devices.get(rank.rank or 0)) for rank in ranks]
    divergence = single.first_divergence
    if divergence is not None and divergence.position < len(reference["top2"]):
        body["reference"]["top2_at_divergence"] = reference["top2"][divergence.position]
    path = await asyncio.to_thread(store.write, body)
    say(f"record {body['qualification_id']} written to {path} (pid {os.getpid()})")
    return {**body, "path": str(path)}
