"""Accounting for a request: the evidence object, metrics, the ledger line, the bundle.

One place decides what an operator can later read about a request, for the
native and the chunked track alike, and for requests that ended early.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from service.evidence import evidence_bundle_path
from service.ledger import JsonLinesLedger, write_json_atomic
from service.metrics import GatewayMetrics
from service.state import BackendTag
from service.transcription.job import ChunkedPlan, Outcome, PassResult, TranscriptionJob

logger = logging.getLogger(__name__)


class Accountant:
    """Writes what every request leaves behind; built once per app."""

    def __init__(self, *, metrics: GatewayMetrics, ledger: JsonLinesLedger, state_dir: Path) -> None:
        self.metrics = metrics
        self.ledger = ledger
        self.state_dir = state_dir

    def evidence(self, outcome: Outcome, backend: BackendTag) -> dict[str, Any]:
        """The `moss` object of responses and of the stream's last event."""
        job, timings = outcome.job, outcome.timings
        decode_s = timings.decode_time_s
        generated = outcome.stop.generated_tokens
        total_s = outcome.total_s
        evidence: dict[str, Any] = {
            "request_id": job.request_id,
            "track": job.track,
            "backend": backend.as_dict(),
            "stop": outcome.stop.as_dict(),
            "budget": job.budget.as_dict(),
            "coverage": outcome.coverage.as_dict(),
            "truncated": outcome.truncated,
            "truncation_reasons": list(outcome.truncation),
            "tokens": {"prompt": outcome.prompt_tokens, "generated": outcome.generated_tokens},
            "timestamp_anomalies": [a.as_dict() for a in outcome.timestamp_anomalies],
            "speech": job.speech.as_dict(),
            "timings": {
                "time_to_first_token_s": _round(timings.time_to_first_token_s),
                "engine_queue_s": _round(timings.engine_queue_s),
                "engine_prefill_s": _round(timings.engine_prefill_s),
                "engine_decode_s": _round(timings.engine_decode_s),
                "decode_s": _round(decode_s),
                "decode_tokens_per_s": _round((generated - 1) / decode_s if decode_s and generated > 1 else None),
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
            "languages": list(job.params.languages),
            "instruction": "custom" if job.params.instruction_override else "default",
            "hotwords": list(job.params.hotwords),
            "anomalies": list(outcome.transcript.anomalies),
            "raw_text": outcome.raw_text,
        }
        if outcome.chunked is not None:
            evidence["cut_plan"] = outcome.chunked.cut_plan
            evidence["chunks"] = [
                {**chunk_summary(p), "raw_text": p.final.text, "local_segments": [_segment(s) for s in p.transcript.segments]}
                for p in outcome.passes
            ]
            evidence["stitching"] = outcome.chunked.stitching
            evidence["speakers"] = outcome.chunked.speakers
        if outcome.recovery is not None:
            evidence["recovery"] = {
                **recovery_summary(outcome),
                "stitching": outcome.recovery.stitching,
                "speakers": outcome.recovery.speakers,
            }
        return evidence

    async def account(self, outcome: Outcome, backend: BackendTag, *, status: int) -> None:
        """Metrics and the ledger line of a request that produced a transcript."""
        job, metrics, track = outcome.job, self.metrics, outcome.job.track
        total_s = outcome.total_s
        metrics.latency.labels(track).observe(total_s)
        if outcome.timings.time_to_first_token_s is not None:
            metrics.ttft.labels(track).observe(outcome.timings.time_to_first_token_s)
        metrics.rtf.labels(track).observe(total_s / job.audio.duration_s)
        metrics.audio_seconds.labels(track).inc(job.audio.duration_s)
        metrics.prompt_tokens.labels(track).inc(outcome.prompt_tokens)
        metrics.generated_tokens.labels(track).inc(outcome.generated_tokens)
        metrics.stops.labels(track, outcome.stop.stop).inc()
        if outcome.truncated:
            metrics.truncations.labels(track).inc()
            logger.warning("%s truncated: %s", job.request_id, "; ".join(outcome.truncation))
        line = {
            **self._ledger_base(job, backend, status),
            "chunks": None if outcome.chunked is None else [chunk_summary(p) for p in outcome.passes],
            "recovery": None if outcome.recovery is None else recovery_summary(outcome),
            "stop": outcome.stop.as_dict(),
            "coverage": outcome.coverage.as_dict(),
            "timestamp_anomalies": [a.as_dict() for a in outcome.timestamp_anomalies],
            "truncated": outcome.truncated,
            "tokens": {"prompt": outcome.prompt_tokens, "generated": outcome.generated_tokens},
            "timings": {"total_s": _round(total_s), "time_to_first_token_s": _round(outcome.timings.time_to_first_token_s)},
        }
        self.ledger.submit(line)  # batched by the ledger's writer thread, off the event loop
        if job.params.capture_evidence:
            await asyncio.to_thread(self._write_bundle, outcome, backend)

    def account_abort(self, job: TranscriptionJob, backend: BackendTag, *, status: int, reason: str) -> None:
        """A request that ended without a transcript (client gone, timeout, engine error)."""
        self.metrics.stops.labels(job.track, "aborted" if status == 499 else "error").inc()
        line = {**self._ledger_base(job, backend, status), "stop": {"stop": "aborted" if status == 499 else "error", "reason": reason}}
        self.ledger.submit(line)  # never blocks: safe in a cancelled task or a closing generator


    def _ledger_base(self, job: TranscriptionJob, backend: BackendTag, status: int) -> dict[str, Any]:
        """What every ledger line says about the request, whatever its end."""
        cuts = job.plan.cuts if isinstance(job.plan, ChunkedPlan) else None
        return {
            "request_id": job.request_id,
            "time": job.received_at,
            "status": status,
            "track": job.track,
            "track_requested": job.params.track.mode,
            "cut_plan_sha256": None if cuts is None else cuts.sha256,
            "cuts": None if cuts is None else [cut.as_dict() for cut in cuts.cuts],
            "fingerprint": backend.fingerprint,
            "qualification_id": backend.qualification_id,
            "audio_sha256": job.audio.sha256,
            "audio_duration_s": round(job.audio.duration_s, 3),
            "response_format": job.params.response_format.value,
            "stream": job.params.stream,
            "budget": job.budget.as_dict(),
        }

    def _write_bundle(self, outcome: Outcome, backend: BackendTag) -> None:
        """The full evidence bundle of one request (admin: GET /admin/evidence/{request_id})."""
        job = outcome.job
        native = outcome.passes[0] if job.track != "chunked" else None
        bundle = {
            "request_id": job.request_id,
            "time": job.received_at,
            "fingerprint": backend.fingerprint,
            "generation": {
                "max_tokens": job.budget.max_tokens,
                "temperature": job.params.temperature,
                "ignore_eos": job.params.ignore_eos,
                "instruction": job.instruction,
                "skip_special_tokens": True,
            },
            "token_ids": None if native is None else native.final.all_token_ids,
            "last_64": None if native is None else native.last_64,
            "checkpoints": None if native is None else list(native.checkpoints),
            "passes": [
                {
                    **chunk_summary(p),
                    "token_ids": p.final.all_token_ids,
                    "last_64": p.last_64,
                    "checkpoints": list(p.checkpoints),
                    "raw_text": p.final.text,
                }
                for p in outcome.passes
            ],
            "stop": outcome.stop.as_dict(),
            "budget": job.budget.as_dict(),
            "coverage": outcome.coverage.as_dict(),
            "truncation_reasons": list(outcome.truncation),
        }
        write_json_atomic(evidence_bundle_path(self.state_dir, job.request_id), bundle)


def chunk_summary(result: PassResult) -> dict[str, Any]:
    """One engine pass in the evidence: its span, stop, budget and coverage."""
    return {
        "index": 0 if result.cut is None else result.cut.index,
        "start_s": 0.0 if result.cut is None else result.cut.start_s,
        "end_s": result.coverage.audio_duration_s if result.cut is None else result.cut.end_s,
        "request_id": result.request_id,
        "stop": result.stop.as_dict(),
        "budget": result.budget.as_dict(),
        "coverage": result.coverage.as_dict(),
        "tokens": {"prompt": result.budget.prompt_tokens, "generated": result.stop.generated_tokens},
    }


def recovery_summary(outcome: Outcome) -> dict[str, Any]:
    """The recovery track in the evidence and the ledger: the native verdict, then every further pass."""
    report = outcome.recovery
    assert report is not None
    return {
        "native": {
            "stop": outcome.passes[0].stop.stop,
            "coverage": report.native_coverage.as_dict(),
            "truncated": bool(report.native_truncation),
            "truncation_reasons": list(report.native_truncation),
        },
        "passes": [
            {
                **chunk_summary(p.result),
                "cut_s": p.result.cut.start_s if p.result.cut is not None else 0.0,
                "covered_before_s": p.covered_before_s,
                "covered_after_s": p.covered_after_s,
                "used": p.used,
            }
            for p in report.passes
        ],
        "stopped_because": report.stopped_because,
        "recovered": any(p.used for p in report.passes),
    }


def _segment(segment: Any) -> dict[str, Any]:
    return {"id": segment.id, "start": segment.start, "end": segment.end, "speaker": segment.speaker, "text": segment.text}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
