"""Accounting for a finished request: the evidence object, metrics, the ledger line, the bundle.

One place decides what an operator can later read about a request, for the
native and the chunked track alike."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from service.api.transcriptions.jobs import Outcome, PreparedJob
from service.engine.protocol import GenerationUpdate
from service.ledger import write_json_atomic
from service.state import GatewayState

logger = logging.getLogger(__name__)


class AccountingMixin:
    """Evidence and accounting of `TranscriptionService` (needs `self.state`)."""

    state: GatewayState

    def evidence(self, outcome: Outcome) -> dict[str, Any]:
        job, timings = outcome.job, outcome.timings
        decode_s = timings.decode_time_s
        decode_rate = (
            (outcome.stop.generated_tokens - 1) / decode_s if decode_s and outcome.stop.generated_tokens > 1 else None
        )
        total_s = outcome.finished - job.started
        gate = self.state.gate
        return {
            "request_id": job.request_id,
            "track": job.track,
            "backend": {"fingerprint": gate.fingerprint, "qualification_id": gate.qualification_id},
            "stop": outcome.stop.as_dict(),
            "budget": job.budget.as_dict(),
            "coverage": outcome.coverage.as_dict(),
            "truncated": outcome.truncated,
            "truncation_reasons": outcome.truncation,
            "tokens": {"prompt": job.budget.prompt_tokens, "generated": outcome.stop.generated_tokens},
            "timings": {
                "time_to_first_token_s": _round(timings.time_to_first_token_s),
                "engine_queue_s": _round(timings.engine_queue_s),
                "engine_prefill_s": _round(timings.engine_prefill_s),
                "engine_decode_s": _round(timings.engine_decode_s),
                "decode_s": _round(decode_s),
                "decode_tokens_per_s": _round(decode_rate),
                "total_s": _round(total_s),
                "real_time_factor": _round(total_s / job.audio.duration_s),
            },
            "audio": {
                "sha256": job.audio.sha256,
                "duration_s": round(job.audio.duration_s, 3),
                "container": job.audio.container,
                "codec": job.audio.codec,
                "source_sample_rate": job.audio.source_sample_rate,
                "source_channels": job.audio.source_channels,
            },
            "language": job.params.language,
            "instruction": "custom" if job.params.instruction_override else "default",
            "hotwords": list(job.params.hotwords),
            "anomalies": list(outcome.transcript.anomalies),
            "raw_text": outcome.raw_text,
            **{k: v for k, v in outcome.extra.items() if k != "chunk_summaries"},
        }

    async def account(self, outcome: Outcome, *, status: int) -> None:
        metrics, job = self.state.metrics, outcome.job
        total_s = outcome.finished - job.started
        track = job.track
        metrics.latency.labels(track).observe(total_s)
        if outcome.timings.time_to_first_token_s is not None:
            metrics.ttft.labels(track).observe(outcome.timings.time_to_first_token_s)
        metrics.rtf.labels(track).observe(total_s / job.audio.duration_s)
        metrics.audio_seconds.labels(track).inc(job.audio.duration_s)
        metrics.prompt_tokens.labels(track).inc(job.budget.prompt_tokens)
        metrics.generated_tokens.labels(track).inc(outcome.stop.generated_tokens)
        metrics.stops.labels(track, outcome.stop.stop).inc()
        if outcome.truncated:
            metrics.truncations.labels(track).inc()
            logger.warning("%s truncated: %s", job.request_id, "; ".join(outcome.truncation))
        line = {
            **self._ledger_base(job, status),
            "cuts": None if job.plan is None else [cut.as_dict() for cut in job.plan.cuts],
            "chunks": outcome.extra.get("chunk_summaries"),
            "stop": outcome.stop.as_dict(),
            "coverage": outcome.coverage.as_dict(),
            "truncated": outcome.truncated,
            "tokens": {"prompt": job.budget.prompt_tokens, "generated": outcome.stop.generated_tokens},
            "timings": self.evidence(outcome)["timings"],
        }
        await asyncio.to_thread(self.state.request_ledger.append, line)
        if job.params.capture_evidence:
            await asyncio.to_thread(self._write_bundle, outcome)

    def _write_bundle(self, outcome: Outcome) -> None:
        """The full evidence bundle of one request (admin: GET /admin/evidence/{request_id})."""
        engine = self.state.require_engine()
        job, ids = outcome.job, outcome.token_ids
        bundle = {
            "request_id": job.request_id,
            "time": job.received_at,
            "fingerprint": self.state.gate.fingerprint,
            "generation": {
                "max_tokens": job.budget.max_tokens,
                "temperature": job.params.temperature,
                "ignore_eos": job.params.ignore_eos,
                "eos_token_ids": list(engine.eos_token_ids),
                "instruction": job.instruction,
                "skip_special_tokens": True,
            },
            "token_ids": ids,
            "last_64": {
                "token_ids": ids[-64:],
                "text": engine.decode(ids[-64:], skip_special_tokens=True),
                "text_with_special_tokens": engine.decode(ids[-64:], skip_special_tokens=False),
            },
            "checkpoints": job.checkpoints,
            "stop": outcome.stop.as_dict(),
            "budget": job.budget.as_dict(),
            "coverage": outcome.coverage.as_dict(),
            "truncation_reasons": outcome.truncation,
            "raw_text": outcome.raw_text,
        }
        write_json_atomic(evidence_path(self.state, job.request_id), bundle)

    def _ledger_base(self, job: PreparedJob, status: int) -> dict[str, Any]:
        """What every ledger line says about the request, whatever its end."""
        return {
            "request_id": job.request_id,
            "time": job.received_at,
            "status": status,
            "track": job.track,
            "cut_plan_sha256": None if job.plan is None else job.plan.sha256,
            "fingerprint": self.state.gate.fingerprint,
            "qualification_id": self.state.gate.qualification_id,
            "audio_sha256": job.audio.sha256,
            "audio_duration_s": round(job.audio.duration_s, 3),
            "response_format": job.params.response_format.value,
            "stream": job.params.stream,
            "budget": job.budget.as_dict(),
        }

    def account_abort(self, job: PreparedJob, final: GenerationUpdate | None) -> None:
        """A client that went away: counted as an `aborted` stop, and in the ledger."""
        self.state.metrics.stops.labels(job.track, "aborted").inc()
        line = {**self._ledger_base(job, 499), "stop": {"stop": "aborted", "finish_reason": "abort"}}
        try:
            self.state.request_ledger.append(line)
        except OSError:
            logger.exception("could not write the ledger line of %s", job.request_id)


def evidence_path(state: GatewayState, request_id: str) -> Path:
    return state.settings.state_dir / "evidence" / f"{request_id}.json"


def _kv_cache_usage() -> float | None:
    """vLLM's own KV-cache usage gauge, when the engine exports it."""
    from prometheus_client import REGISTRY

    for family in REGISTRY.collect():
        if family.name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            for sample in family.samples:
                return float(sample.value)
    return None


def progress_checkpoint(job: PreparedJob, update: GenerationUpdate, now: float) -> dict[str, Any]:
    elapsed = now - job.started
    return {
        "monotonic_s": round(now, 4),
        "elapsed_s": round(elapsed, 4),
        "generated_tokens": update.num_generated,
        "tokens_per_s": round(update.num_generated / elapsed, 3) if elapsed > 0 else None,
        "kv_cache_usage": _kv_cache_usage(),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
