"""The transcription job: decode, budget, generate, parse, account, answer.

The route only gathers form fields; everything a request goes through lives
here, so the streaming and non-streaming paths share one pipeline and one set
of evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

from service.api.transcriptions.accounting import AccountingMixin, progress_checkpoint
from service.api.transcriptions.jobs import (
    PROGRESS_EVERY_TOKENS,
    Outcome,
    PreparedJob,
    placeholder_budget,
    wants_deltas,
)
from service.api.transcriptions.protocol import TranscriptionParams
from service.api.transcriptions.responses import ResponsesMixin
from service.api.transcriptions.streaming import StreamingMixin
from service.audio import decode_audio
from service.budget import BudgetPolicy, EngineLimits, TokenBudget, plan_budget
from service.engine.protocol import EngineDeadError, EngineTimings, GenerationRequest, GenerationUpdate
from service.errors import ErrorCode, GatewayError
from service.evidence import StopRecord, classify_stop, measure_coverage, truncation_reasons
from service.prompt import build_instruction
from service.state import GatewayState
from service.transcript import parse_transcript

logger = logging.getLogger(__name__)


class TranscriptionService(StreamingMixin, AccountingMixin, ResponsesMixin):
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
            else placeholder_budget(audio.duration_s),
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
                        job.checkpoints.append(progress_checkpoint(job, update, now))
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


    # -- answering --------------------------------------------------------------


    # -- streaming ----------------------------------------------------------------


