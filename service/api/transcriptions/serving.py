"""The transcription job: decode, budget, generate, parse, account, answer.

The route only gathers form fields; everything a request goes through lives
here, so the streaming and non-streaming paths share one pipeline and one set
of evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from service.api.transcriptions.protocol import ResponseFormat, TranscriptionParams
from service.audio import DecodedAudio, decode_audio
from service.budget import BudgetPolicy, EngineLimits, TokenBudget, plan_budget
from service.engine.protocol import EngineDeadError, EngineTimings, GenerationRequest, GenerationUpdate
from service.errors import ErrorCode, GatewayError
from service.evidence import Coverage, StopRecord, classify_stop, measure_coverage, truncation_reasons
from service.formats import render_srt, render_vtt
from service.ledger import write_json_atomic
from service.longform import CutPlan
from service.prompt import build_instruction
from service.state import GatewayState
from service.transcript import ParsedTranscript, Segment, parse_transcript

logger = logging.getLogger(__name__)

TRACK_NATIVE = "native"
TRACK_CHUNKED = "chunked"
#: A complete `[start][Sxx]text[end]` segment, for emitting segment events while streaming.
_STREAM_SEGMENT = re.compile(
    r"\[\s*(?P<start>\d+(?:\.\d+)?)\s*\]\s*\[\s*(?P<speaker>S\d+)\s*\](?P<text>[^\[]*?)\[\s*(?P<end>\d+(?:\.\d+)?)\s*\]"
)
PROGRESS_EVERY_TOKENS = 256
#: Passes over this much audio report per-token progress (log lines) even when not streamed.
PROGRESS_AUDIO_S = 300.0


@dataclass
class PreparedJob:
    request_id: str
    params: TranscriptionParams
    audio: DecodedAudio
    budget: TokenBudget
    instruction: str
    started: float
    received_at: str
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    plan: CutPlan | None = None
    chunk_budgets: list[TokenBudget] = field(default_factory=list)

    @property
    def track(self) -> str:
        return TRACK_NATIVE if self.plan is None else TRACK_CHUNKED


@dataclass
class Outcome:
    job: PreparedJob
    raw_text: str
    token_ids: list[int]
    transcript: ParsedTranscript
    stop: StopRecord
    coverage: Coverage
    truncation: list[str]
    timings: EngineTimings
    finished: float
    extra: dict[str, Any] = field(default_factory=dict)  # the chunked track's own evidence

    @property
    def truncated(self) -> bool:
        return bool(self.truncation)


class TranscriptionService:
    """Runs transcription jobs against the app's engine and accounts for them."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    # -- preparation ----------------------------------------------------
    async def prepare(self, params: TranscriptionParams, data: bytes, filename: str | None) -> PreparedJob:
        state = self.state
        started = time.monotonic()
        engine = state.require_engine()
        state.require_qualified()
        if not data:
            raise GatewayError(ErrorCode.EMPTY_FILE, "The uploaded file is empty (0 bytes).", param="file")
        limits = state.settings
        chunked = params.chunking is not None
        max_duration = limits.chunked_max_duration_s if chunked else limits.max_duration_s
        try:
            audio = await asyncio.to_thread(
                decode_audio, data, filename=filename, target_rate=engine.sample_rate, max_duration_s=max_duration
            )
        except GatewayError as error:
            if error.code is ErrorCode.AUDIO_TOO_LONG:
                raise self._too_long(None, chunked=chunked) from None
            raise
        if audio.duration_s < limits.audio.min_duration_s:
            raise GatewayError(
                ErrorCode.AUDIO_TOO_SHORT,
                f"The audio is {audio.duration_s:.3f} s long; the shortest accepted is "
                f"{limits.audio.min_duration_s:g} s.",
                param="file",
            )
        if audio.duration_s > max_duration:
            raise self._too_long(audio.duration_s, chunked=chunked)
        instruction = build_instruction(params.instruction_override, params.hotwords)
        job = PreparedJob(
            request_id=f"trsc-{uuid.uuid4().hex}",
            params=params,
            audio=audio,
            budget=self._budget(len(audio.samples), instruction, params.max_completion_tokens)
            if not chunked
            else _placeholder_budget(audio.duration_s),
            instruction=instruction,
            started=started,
            received_at=datetime.now(UTC).isoformat(),
        )
        if chunked:
            from service.api.transcriptions.chunked import plan_job

            await plan_job(self, job)
        return job

    def _too_long(self, duration_s: float | None, *, chunked: bool) -> GatewayError:
        limits = self.state.settings
        length = "" if duration_s is None else f"{duration_s:.1f} s long; "
        if chunked:
            return GatewayError(
                ErrorCode.AUDIO_TOO_LONG,
                f"The audio is {length or 'longer than the limit; '}the chunked track accepts up to "
                f"{limits.chunked_max_duration_s:g} s (longform.max_duration_s).",
                param="file",
            )
        return GatewayError(
            ErrorCode.AUDIO_TOO_LONG,
            f"The audio is {length or 'longer than the limit; '}the longest accepted in one native pass is "
            f"{limits.max_duration_s:g} s (audio.max_duration_s). Ask for the chunked track with "
            f"chunking_strategy=auto (up to {limits.chunked_max_duration_s:g} s).",
            param="file",
        )

    def _budget(self, num_samples: int, instruction: str, requested: int | None) -> TokenBudget:
        """The output budget of one engine pass over `num_samples` of audio."""
        engine = self.state.require_engine()
        limits = self.state.settings
        return plan_budget(
            duration_s=num_samples / engine.sample_rate,
            num_samples=num_samples,
            prompt_tokens=engine.count_prompt_tokens(num_samples, instruction),
            requested_max_tokens=requested,
            policy=BudgetPolicy(
                observed_tokens_per_second=limits.budget.observed_tokens_per_second,
                conservative_tokens_per_second=limits.budget.conservative_tokens_per_second,
                minimum_budget=limits.budget.minimum_budget,
            ),
            limits=EngineLimits(
                max_model_len=engine.max_model_len,
                encoder_budget_tokens=limits.effective_max_num_batched_tokens,
                kv_bytes_per_token_bf16=getattr(engine, "kv_bytes_per_token_bf16", 0),
            ),
        )

    def _engine_request(self, job: PreparedJob) -> GenerationRequest:
        return GenerationRequest(
            request_id=job.request_id,
            audio=job.audio.samples,
            instruction=job.instruction,
            max_tokens=job.budget.max_tokens,
            temperature=job.params.temperature,
            ignore_eos=job.params.ignore_eos,
            stream_deltas=wants_deltas(job, job.audio.duration_s),
        )

    # -- running ------------------------------------------------------------
    async def _updates(
        self, job: PreparedJob, request: GenerationRequest | None = None
    ) -> AsyncIterator[GenerationUpdate]:
        """Engine updates with in-flight accounting and progress logging (one engine pass)."""
        engine = self.state.require_engine()
        request = request or self._engine_request(job)
        metrics = self.state.metrics
        metrics.in_flight.inc()
        next_log = PROGRESS_EVERY_TOKENS
        evidence = self.state.settings.evidence
        next_checkpoint_tokens = evidence.checkpoint_every_tokens
        next_checkpoint_at = time.monotonic() + evidence.checkpoint_every_s
        started_generating = False
        try:
            stream = engine.generate(request)
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async for update in stream:
                    started_generating = True
                    if update.num_generated >= next_log:
                        next_log = (update.num_generated // PROGRESS_EVERY_TOKENS + 1) * PROGRESS_EVERY_TOKENS
                        logger.info(
                            "%s: %d/%d tokens generated", request.request_id, update.num_generated, request.max_tokens
                        )
                    now = time.monotonic()
                    if job.params.capture_evidence and job.plan is None and (
                        update.num_generated >= next_checkpoint_tokens or now >= next_checkpoint_at or update.finished
                    ):
                        job.checkpoints.append(_checkpoint(job, update, now))
                        next_checkpoint_tokens = update.num_generated + evidence.checkpoint_every_tokens
                        next_checkpoint_at = now + evidence.checkpoint_every_s
                    yield update
        except EngineDeadError as exc:
            self.state.mark_engine_dead(str(exc))
            if not started_generating:
                # Nothing was generated for this request: it never really ran, so it is refused like any new one.
                raise GatewayError(
                    ErrorCode.ENGINE_NOT_READY,
                    f"The engine is down ({exc}); the gateway is restarting it. Retry when GET /ready answers 200.",
                    headers={"Retry-After": str(self.state.settings.limits.retry_after_s)},
                ) from exc
            raise GatewayError(
                ErrorCode.ENGINE_ERROR,
                f"The engine died during the request ({exc}); the gateway is restarting it.",
            ) from exc
        finally:
            metrics.in_flight.dec()

    def classify(self, final: GenerationUpdate, budget: TokenBudget) -> StopRecord:
        """The stop of one engine pass, from what the engine reported."""
        engine = self.state.require_engine()
        return classify_stop(
            finish_reason=final.finish_reason,
            stop_reason=final.stop_reason,
            token_ids=final.all_token_ids,
            eos_token_ids=engine.eos_token_ids,
            max_tokens=budget.max_tokens,
            prompt_tokens=final.prompt_token_count or budget.prompt_tokens,
            max_model_len=engine.max_model_len,
            token_text=engine.token_text,
        )

    def _conclude(self, job: PreparedJob, final: GenerationUpdate) -> Outcome:
        transcript = parse_transcript(final.text)
        stop = self.classify(final, job.budget)
        coverage = measure_coverage(transcript, job.audio.duration_s)
        reasons = truncation_reasons(stop, coverage, margin_s=self.state.settings.budget.coverage_margin_s)
        return Outcome(
            job=job,
            raw_text=final.text,
            token_ids=final.all_token_ids,
            transcript=transcript,
            stop=stop,
            coverage=coverage,
            truncation=reasons,
            timings=final.timings or EngineTimings(submitted=job.started),
            finished=time.monotonic(),
        )

    async def run(self, job: PreparedJob, is_disconnected: Callable[[], Awaitable[bool]]) -> Outcome:
        """Generate to the end; abort the engine request if the client goes away."""
        final: GenerationUpdate | None = None
        chunked: Outcome | None = None

        async def consume() -> None:
            nonlocal final, chunked
            if job.plan is not None:
                from service.api.transcriptions.chunked import run_chunked

                chunked = await run_chunked(self, job)
                return
            async for update in self._updates(job):
                if update.finished:
                    final = update

        task = asyncio.create_task(consume())
        try:
            while not task.done():
                done, _ = await asyncio.wait({task}, timeout=0.5)
                if not done and await is_disconnected():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    self.account_abort(job, final)
                    raise GatewayError(ErrorCode.INVALID_REQUEST, "The client disconnected; the request was aborted.")
            task.result()
        except asyncio.CancelledError:
            task.cancel()
            self.account_abort(job, final)
            raise
        if chunked is not None:
            await self.account(chunked, status=200)
            return chunked
        if final is None:
            raise GatewayError(ErrorCode.ENGINE_ERROR, "The engine ended the request without a final output.")
        outcome = self._conclude(job, final)
        await self.account(outcome, status=200)
        return outcome

    # -- accounting -----------------------------------------------------------
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
            "request_id": job.request_id,
            "time": job.received_at,
            "status": status,
            "track": job.track,
            "cut_plan_sha256": None if job.plan is None else job.plan.sha256,
            "cuts": None if job.plan is None else [cut.as_dict() for cut in job.plan.cuts],
            "chunks": outcome.extra.get("chunk_summaries"),
            "fingerprint": self.state.gate.fingerprint,
            "qualification_id": self.state.gate.qualification_id,
            "audio_sha256": job.audio.sha256,
            "audio_duration_s": round(job.audio.duration_s, 3),
            "response_format": job.params.response_format.value,
            "stream": job.params.stream,
            "budget": job.budget.as_dict(),
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

    def account_abort(self, job: PreparedJob, final: GenerationUpdate | None) -> None:
        """A client that went away: counted as an `aborted` stop, and in the ledger."""
        self.state.metrics.stops.labels(job.track, "aborted").inc()
        line = {
            "request_id": job.request_id,
            "time": job.received_at,
            "status": 499,
            "track": job.track,
            "cut_plan_sha256": None if job.plan is None else job.plan.sha256,
            "fingerprint": self.state.gate.fingerprint,
            "audio_sha256": job.audio.sha256,
            "audio_duration_s": round(job.audio.duration_s, 3),
            "response_format": job.params.response_format.value,
            "stream": job.params.stream,
            "budget": job.budget.as_dict(),
            "stop": {"stop": "aborted", "finish_reason": "abort"},
        }
        try:
            self.state.request_ledger.append(line)
        except OSError:
            logger.exception("could not write the ledger line of %s", job.request_id)

    # -- answering --------------------------------------------------------------
    def headers(self, outcome: Outcome) -> dict[str, str]:
        gate = self.state.gate
        return {
            "X-Request-Id": outcome.job.request_id,
            "X-Moss-Track": outcome.job.track,
            "X-Moss-Cut-Plan-Sha256": "" if outcome.job.plan is None else outcome.job.plan.sha256,
            "X-Moss-Stop": outcome.stop.stop,
            "X-Moss-Truncated": "true" if outcome.truncated else "false",
            "X-Moss-Generated-Tokens": str(outcome.stop.generated_tokens),
            "X-Moss-Max-Tokens": str(outcome.job.budget.max_tokens),
            "X-Moss-Coverage": f"{outcome.coverage.coverage:.4f}",
            "X-Moss-Uncovered-Tail-S": f"{outcome.coverage.uncovered_tail_s:.3f}",
            "X-Moss-Backend-Fingerprint": gate.fingerprint or "",
            "X-Moss-Qualification-Id": gate.qualification_id or "",
        }

    def usage(self, outcome: Outcome) -> dict[str, Any]:
        prompt = outcome.job.budget.prompt_tokens
        generated = outcome.stop.generated_tokens
        audio_tokens = outcome.job.budget.audio_tokens
        return {
            "type": "tokens",
            "input_tokens": prompt,
            "input_token_details": {"audio_tokens": audio_tokens, "text_tokens": prompt - audio_tokens},
            "output_tokens": generated,
            "total_tokens": prompt + generated,
        }

    def body(self, outcome: Outcome) -> dict[str, Any] | str:
        """The response body in the requested format."""
        fmt = outcome.job.params.response_format
        transcript = outcome.transcript
        segments = transcript.segments
        if fmt is ResponseFormat.TEXT:
            return transcript.text
        if fmt is ResponseFormat.SRT:
            return render_srt(segments)
        if fmt is ResponseFormat.VTT:
            return render_vtt(segments)
        backend = {
            "fingerprint": self.state.gate.fingerprint,
            "qualification_id": self.state.gate.qualification_id,
        }
        if fmt is ResponseFormat.JSON:
            return {"text": transcript.text, "usage": self.usage(outcome), "backend": backend}
        duration = round(outcome.job.audio.duration_s, 3)
        if fmt is ResponseFormat.VERBOSE_JSON:
            return {
                "task": "transcribe",
                "language": outcome.job.params.language or "unknown",
                "duration": duration,
                "text": transcript.text,
                "segments": [_verbose_segment(s, outcome.job.params.temperature) for s in segments],
                "usage": self.usage(outcome),
                "backend": backend,
                "moss": self.evidence(outcome),
            }
        return {
            "task": "transcribe",
            "duration": duration,
            "text": transcript.text,
            "segments": [diarized_segment(s) for s in segments],
            "usage": self.usage(outcome),
            "backend": backend,
            "moss": self.evidence(outcome),
        }

    def respond(self, outcome: Outcome) -> Response:
        body = self.body(outcome)
        headers = self.headers(outcome)
        fmt = outcome.job.params.response_format
        if isinstance(body, str):
            media = {ResponseFormat.SRT: "application/x-subrip", ResponseFormat.VTT: "text/vtt"}.get(fmt, "text/plain")
            return PlainTextResponse(body, headers=headers, media_type=f"{media}; charset=utf-8")
        return JSONResponse(body, headers=headers)

    # -- streaming ----------------------------------------------------------------
    def stream_response(self, job: PreparedJob, *, on_close: Callable[[], None] | None = None) -> StreamingResponse:
        headers = {"X-Request-Id": job.request_id, "X-Moss-Track": job.track, "Cache-Control": "no-cache"}
        gate = self.state.gate
        headers["X-Moss-Backend-Fingerprint"] = gate.fingerprint or ""
        headers["X-Moss-Qualification-Id"] = gate.qualification_id or ""
        return StreamingResponse(self._events(job, on_close), media_type="text/event-stream", headers=headers)

    async def _events(self, job: PreparedJob, on_close: Callable[[], None] | None = None) -> AsyncIterator[bytes]:
        """The stream, bounded by the request timeout; `on_close` frees the admission slot."""
        try:
            async with asyncio.timeout(self.state.settings.limits.request_timeout_s):
                async for event in self._stream_events(job):
                    yield event
        except TimeoutError:
            yield _sse({"type": "error", "error": self.timeout_error().body()["error"]})
        finally:
            if on_close is not None:
                on_close()

    def timeout_error(self) -> GatewayError:
        limit = self.state.settings.limits.request_timeout_s
        return GatewayError(
            ErrorCode.REQUEST_TIMEOUT,
            f"The transcription ran longer than {limit:g} s (limits.request_timeout_s) and was aborted.",
        )

    async def _stream_chunked(self, job: PreparedJob) -> AsyncIterator[bytes]:
        """The chunked track streams its stitched segments once every chunk is done (no token deltas)."""
        from service.api.transcriptions.chunked import run_chunked

        assert job.plan is not None
        yield _sse({"type": "moss.progress", "chunks": len(job.plan.cuts), "cut_plan_sha256": job.plan.sha256})
        try:
            outcome = await run_chunked(self, job)
        except GatewayError as error:
            yield _sse({"type": "error", "error": error.body()["error"]})
            return
        except asyncio.CancelledError:
            self.account_abort(job, None)
            raise
        await self.account(outcome, status=200)
        for segment in outcome.transcript.segments:
            yield _sse(diarized_segment(segment))
        yield _sse(self.done_event(outcome))

    async def _stream_events(self, job: PreparedJob) -> AsyncIterator[bytes]:
        """OpenAI's stream events, plus progress and the evidence on the final event."""
        if job.plan is not None:
            async for event in self._stream_chunked(job):
                yield event
            return
        text = ""
        scan_from = 0
        segment_index = 0
        final: GenerationUpdate | None = None
        next_progress = PROGRESS_EVERY_TOKENS
        try:
            async for update in self._updates(job):
                if update.text_delta:
                    text += update.text_delta
                    yield _sse({"type": "transcript.text.delta", "delta": update.text_delta})
                    for match in _STREAM_SEGMENT.finditer(text, scan_from):
                        scan_from = match.end()
                        start, end = float(match["start"]), float(match["end"])
                        segment = Segment(
                            id=segment_index, start=start, end=max(start, end),
                            speaker=match["speaker"], text=match["text"].strip(),
                        )
                        segment_index += 1
                        yield _sse(diarized_segment(segment))
                if update.num_generated >= next_progress and not update.finished:
                    next_progress = (update.num_generated // PROGRESS_EVERY_TOKENS + 1) * PROGRESS_EVERY_TOKENS
                    yield _sse({
                        "type": "moss.progress",
                        "generated_tokens": update.num_generated,
                        "max_tokens": job.budget.max_tokens,
                    })
                if update.finished:
                    final = update
        except GatewayError as error:
            yield _sse({"type": "error", "error": error.body()["error"]})
            return
        except asyncio.CancelledError:
            self.account_abort(job, final)
            raise
        if final is None:
            yield _sse({"type": "error", "error": {"message": "The engine ended without a final output.",
                                                    "type": "server_error", "code": "engine_error", "param": None}})
            return
        outcome = self._conclude(job, final)
        await self.account(outcome, status=200)
        yield _sse(self.done_event(outcome))

    def done_event(self, outcome: Outcome) -> dict[str, Any]:
        """The stream's last event: OpenAI's `transcript.text.done` with the stop evidence."""
        return {
            "type": "transcript.text.done",
            "text": outcome.transcript.text,
            "usage": self.usage(outcome),
            "backend": {"fingerprint": self.state.gate.fingerprint, "qualification_id": self.state.gate.qualification_id},
            "moss": self.evidence(outcome),
        }


def wants_deltas(job: PreparedJob, pass_duration_s: float) -> bool:
    """Per-token updates only where someone uses them: streams, evidence, progress of long passes."""
    return job.params.stream or job.params.capture_evidence or pass_duration_s > PROGRESS_AUDIO_S


def _placeholder_budget(duration_s: float) -> TokenBudget:
    """Replaced by the sum of the chunks' budgets once the cuts are planned."""
    return TokenBudget(
        duration_s=duration_s, audio_tokens=0, prompt_tokens=0, expected_output_tokens=0,
        conservative_output_tokens=0, context_room=0, max_tokens=0, source="default", fits_conservative=True,
        kv_bytes_bf16=0, max_model_len=0,
    )


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


def _checkpoint(job: PreparedJob, update: GenerationUpdate, now: float) -> dict[str, Any]:
    elapsed = now - job.started
    return {
        "monotonic_s": round(now, 4),
        "elapsed_s": round(elapsed, 4),
        "generated_tokens": update.num_generated,
        "tokens_per_s": round(update.num_generated / elapsed, 3) if elapsed > 0 else None,
        "kv_cache_usage": _kv_cache_usage(),
    }


def diarized_segment(segment: Segment) -> dict[str, Any]:
    return {
        "type": "transcript.text.segment",
        "id": f"seg_{segment.id}",
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "speaker": segment.speaker,
    }


def _verbose_segment(segment: Segment, temperature: float) -> dict[str, Any]:
    return {
        "id": segment.id,
        "seek": 0,
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "speaker": segment.speaker,
        "tokens": [],
        "temperature": temperature,
    }


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
