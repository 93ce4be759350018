"""The transcription pipeline: prepare a job, run its track, account for it.

Modelled on an inference router: collaborators are plain fields given at
construction (the app's state, the accountant, the two tracks), every request
is one stream of events, and the non-streaming call simply drains that stream,
so both answers come from one code path. Errors are `GatewayError`s from the
one table; the HTTP layer maps them to a status or to an SSE `error` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import BinaryIO

from service.audio import DecodedAudio, decode_audio
from service.budget import TokenBudget
from service.errors import ErrorCode, GatewayError
from service.ledger import current_request_id
from service.longform import plan_cuts
from service.prompt import build_instruction
from service.speech import SpeechPolicy, detect_speech
from service.state import GatewayState
from service.transcription.accountant import Accountant
from service.transcription.job import (
    ChunkedPlan,
    DoneEvent,
    NativePlan,
    Outcome,
    PipelineEvent,
    RecoveryPlan,
    TranscriptionJob,
)
from service.transcription.params import TranscriptionParams
from service.transcription.tracks import ChunkedTrack, NativeTrack, PassFactory, RecoveryTrack, pass_budget

#: Errors that mean "this audio does not fit one native pass": `auto` then takes the chunked track.
_DOES_NOT_FIT = (ErrorCode.ENCODER_BUDGET_EXCEEDED, ErrorCode.CONTEXT_LENGTH_EXCEEDED)


class TranscriptionPipeline:
    """Prepares, runs and accounts for transcription jobs; built once per app."""

    def __init__(
        self,
        *,
        state: GatewayState,
        accountant: Accountant,
        native: NativeTrack,
        chunked: ChunkedTrack,
        recovery: RecoveryTrack,
    ) -> None:
        self.state = state
        self.accountant = accountant
        self.native = native
        self.chunked = chunked
        self.recovery = recovery

    # -- preparing ------------------------------------------------------------
    async def prepare(
        self, params: TranscriptionParams, upload: bytes | BinaryIO, filename: str | None
    ) -> TranscriptionJob:
        """Decode (an empty upload is refused there), check and plan: the job is complete or refused here."""
        started = time.monotonic()
        engine = self.state.require_engine()
        self.state.require_qualified()
        native_only = params.track.mode == "native"
        limit = self.state.settings.max_duration_s if native_only else self.state.settings.chunked_max_duration_s
        try:
            audio = await asyncio.to_thread(
                decode_audio, upload, filename=filename, target_rate=engine.sample_rate, max_duration_s=limit
            )
        except GatewayError as error:
            if error.code is ErrorCode.AUDIO_TOO_LONG:
                raise self._too_long(None, native_only=native_only) from None
            raise
        self._check_duration(audio, limit, native_only=native_only)
        instruction = build_instruction(params.instruction_override, params.hotwords)
        coverage = self.state.settings.coverage
        speech = await asyncio.to_thread(
            detect_speech, audio.samples, audio.sample_rate, SpeechPolicy(
                above_floor_db=coverage.speech_above_floor_db,
                floor_db=coverage.speech_floor_db,
                ceiling_db=coverage.speech_ceiling_db,
            ),
        )
        return TranscriptionJob(
            request_id=current_request_id() or f"trsc-{uuid.uuid4().hex}",  # the id the ledger layer answers with
            params=params,
            audio=audio,
            instruction=instruction,
            plan=await self._plan(params, audio, instruction),
            started=started,
            received_at=datetime.now(UTC).isoformat(),
            speech=speech,
        )

    def _check_duration(self, audio: DecodedAudio, limit: float, *, native_only: bool) -> None:
        minimum = self.state.settings.audio.min_duration_s
        if audio.duration_s < minimum:
            raise GatewayError(
                ErrorCode.AUDIO_TOO_SHORT,
                f"The audio is {audio.duration_s:.3f} s long; the shortest accepted is {minimum:g} s.",
                param="file",
            )
        if audio.duration_s > limit:
            raise self._too_long(audio.duration_s, native_only=native_only)

    async def _plan(
        self, params: TranscriptionParams, audio: DecodedAudio, instruction: str
    ) -> NativePlan | ChunkedPlan | RecoveryPlan:
        """A native plan becomes a recovery plan when `tail_recovery=auto` was asked for."""
        plan = await self._track_plan(params, audio, instruction)
        if params.tail_recovery and isinstance(plan, NativePlan):
            return RecoveryPlan(plan.budget)
        return plan

    async def _track_plan(self, params: TranscriptionParams, audio: DecodedAudio, instruction: str) -> NativePlan | ChunkedPlan:
        """`native` and `chunked` as asked; `auto`: one pass when the audio fits it, chunks beyond."""
        mode = params.track.mode
        whole = len(audio.samples)
        if mode == "native":
            return NativePlan(self._budget(whole, instruction, params.max_completion_tokens))
        if mode == "auto" and audio.duration_s <= self.state.settings.max_duration_s:
            try:
                return NativePlan(self._budget(whole, instruction, params.max_completion_tokens))
            except GatewayError as error:
                if error.code not in _DOES_NOT_FIT:
                    raise
        cuts = await asyncio.to_thread(
            plan_cuts, audio.samples, audio.sample_rate, policy=params.track.policy, audio_sha256=audio.sha256
        )
        budgets = tuple(
            self._budget(last - first, instruction, params.max_completion_tokens)
            for first, last in (cut.sample_span(audio.sample_rate) for cut in cuts.cuts)
        )
        return ChunkedPlan(cuts=cuts, chunk_budgets=budgets, budget=_sum_budgets(audio.duration_s, budgets))

    def _budget(self, num_samples: int, instruction: str, requested: int | None) -> TokenBudget:
        """The output budget of one engine pass over `num_samples` of audio."""
        return pass_budget(self.state, num_samples, instruction, requested)

    def _too_long(self, duration_s: float | None, *, native_only: bool) -> GatewayError:
        settings = self.state.settings
        length = "longer than the limit; " if duration_s is None else f"{duration_s:.1f} s long; "
        if not native_only:
            return GatewayError(
                ErrorCode.AUDIO_TOO_LONG,
                f"The audio is {length}the chunked track accepts up to {settings.chunked_max_duration_s:g} s "
                f"(longform.max_duration_s).",
                param="file",
            )
        return GatewayError(
            ErrorCode.AUDIO_TOO_LONG,
            f"The audio is {length}the longest accepted in one native pass is {settings.max_duration_s:g} s "
            f"(audio.max_duration_s). Ask for chunking_strategy=auto (up to {settings.chunked_max_duration_s:g} s).",
            param="file",
        )

    # -- running ----------------------------------------------------------------
    async def events(self, job: TranscriptionJob) -> AsyncIterator[PipelineEvent]:
        """The job's events, bounded by the request timeout; every end of it is accounted for once."""
        backend = self.state.gate.tag()
        plan = job.plan
        if isinstance(plan, NativePlan):
            track = self.native.events(job, plan)
        elif isinstance(plan, RecoveryPlan):
            track = self.recovery.events(job, plan)
        else:
            track = self.chunked.events(job, plan)
        deadline = asyncio.get_running_loop().time() + self.state.settings.limits.request_timeout_s
        accounted = False
        try:
            async with contextlib.aclosing(track):  # type: ignore[type-var]  # an async generator has aclose
                while True:
                    try:
                        async with asyncio.timeout_at(deadline):
                            event = await anext(track)
                    except StopAsyncIteration:
                        return
                    except TimeoutError:
                        raise self.timeout_error() from None
                    if isinstance(event, DoneEvent):
                        await self.accountant.account(event.outcome, backend, status=200)
                        accounted = True
                    yield event
        except GatewayError as error:
            if not accounted:
                self.accountant.account_abort(job, backend, status=error.status, reason=error.message)
                accounted = True
            raise
        finally:
            if not accounted:  # the consumer went away (client disconnect, dropped stream)
                self.accountant.account_abort(job, backend, status=499, reason="the client went away")

    async def run(self, job: TranscriptionJob) -> Outcome:
        """The non-streaming call: drain the same events the stream sends."""
        outcome: Outcome | None = None
        async for event in self.events(job):
            if isinstance(event, DoneEvent):
                outcome = event.outcome
        if outcome is None:
            raise GatewayError(ErrorCode.ENGINE_ERROR, "The transcription ended without a result.")
        return outcome

    def timeout_error(self) -> GatewayError:
        limit = self.state.settings.limits.request_timeout_s
        return GatewayError(
            ErrorCode.REQUEST_TIMEOUT,
            f"The transcription ran longer than {limit:g} s (limits.request_timeout_s) and was aborted.",
        )


def _sum_budgets(duration_s: float, budgets: tuple[TokenBudget, ...]) -> TokenBudget:
    return TokenBudget(
        duration_s=duration_s,
        audio_tokens=sum(b.audio_tokens for b in budgets),
        prompt_tokens=sum(b.prompt_tokens for b in budgets),
        expected_output_tokens=sum(b.expected_output_tokens for b in budgets),
        conservative_output_tokens=sum(b.conservative_output_tokens for b in budgets),
        context_room=min(b.context_room for b in budgets),
        max_tokens=sum(b.max_tokens for b in budgets),
        source=budgets[0].source,
        fits_conservative=all(b.fits_conservative for b in budgets),
        kv_bytes_bf16=max(b.kv_bytes_bf16 for b in budgets),
        max_model_len=budgets[0].max_model_len,
    )


def build_pipeline(state: GatewayState) -> TranscriptionPipeline:
    """The pipeline and its collaborators, wired once at start-up."""
    settings = state.settings
    passes = PassFactory(state)
    margin = settings.budget.coverage_margin_s
    return TranscriptionPipeline(
        state=state,
        accountant=Accountant(
            metrics=state.metrics, ledger=state.request_ledger, state_dir=settings.state_dir
        ),
        native=NativeTrack(passes, coverage_margin_s=margin),
        chunked=ChunkedTrack(passes, coverage_margin_s=margin, max_concurrent_chunks=settings.longform.max_concurrent_chunks),
        recovery=RecoveryTrack(passes, coverage_margin_s=margin, settings=settings.coverage),
    )
