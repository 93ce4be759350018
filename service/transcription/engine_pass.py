"""One engine pass: a span of audio through the engine, parsed as it streams.

Every track is made of these passes (the native track one, the chunked track
one per chunk), so in-flight accounting, progress logs, evidence checkpoints,
the stop classification and the mapping of a dying engine to the error table
live here once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from service.budget import TokenBudget
from service.engine.protocol import EngineDeadError, GenerationRequest, GenerationUpdate, TranscriptionEngine
from service.errors import ErrorCode, GatewayError
from service.evidence import StopRecord, Timeline, TimestampAnomaly, classify_stop, measure_coverage
from service.longform import Cut
from service.metrics import GatewayMetrics
from service.settings import CoverageSettings, EvidenceSettings
from service.speech import SpeechActivity
from service.transcript import ParsedTranscript, Segment, TextDelta, TranscriptParser
from service.transcription.job import PassResult, SegmentEvent, TextEvent, TokenLogprob
from service.transcription.segment_stats import segment_stats, token_logprobs

logger = logging.getLogger(__name__)

#: Log a line every this many generated tokens of a long pass.
PROGRESS_EVERY_TOKENS = 256


@dataclass(frozen=True)
class PassContext:
    """What a pass needs besides its request: the engine, where to count, and what to keep."""

    engine: TranscriptionEngine
    metrics: GatewayMetrics
    evidence: EvidenceSettings
    coverage: CoverageSettings
    retry_after_s: int
    capture_evidence: bool


class EnginePass:
    """Runs one `GenerationRequest`; `events()` yields text and segment events, then one `PassResult`.

    Every segment is checked against the audio as it closes (`Timeline`), so the
    streamed segment is already the final one: clamped to the span, and listed
    as an anomaly when its times cannot be right.
    """

    def __init__(
        self,
        context: PassContext,
        request: GenerationRequest,
        *,
        budget: TokenBudget,
        duration_s: float,
        cut: Cut | None,
        speech: SpeechActivity,
        segment_stats: bool,
        stream_logprobs: bool,
    ) -> None:
        self.context = context
        self.request = request
        self.budget = budget
        self.duration_s = duration_s
        self.cut = cut
        self.speech = speech
        self.timeline = Timeline(duration_s, context.coverage.timestamp_tolerance_s)
        self.checked: list[Segment] = []
        self.anomalies: list[TimestampAnomaly] = []
        self.want_segment_stats = segment_stats
        self.stream_logprobs = stream_logprobs
        self._pending_logprobs: list[TokenLogprob] = []
        self.parser = TranscriptParser()
        self.checkpoints: list[dict[str, Any]] = []
        self.started = time.monotonic()
        self._next_checkpoint_tokens = context.evidence.checkpoint_every_tokens
        self._next_checkpoint_at = self.started + context.evidence.checkpoint_every_s

    async def events(self) -> AsyncIterator[TextEvent | SegmentEvent | PassResult]:
        """Engine updates parsed into clean text and settled segments; the last item is the `PassResult`."""
        final: GenerationUpdate | None = None
        async for update in self._updates():
            self._collect_logprobs(update)
            deltas, closed = self.parser.feed(update.text_delta)
            for item in self._parsed(deltas, closed, final=False):
                yield item
            if update.finished:
                final = update
        if final is None:
            raise GatewayError(ErrorCode.ENGINE_ERROR, "The engine ended the request without a final output.")
        transcript = self.parser.finish()
        deltas, closed = self.parser.take_final()
        for item in self._parsed(deltas, closed, final=True):
            yield item
        yield self._result(final, transcript)

    async def result(self) -> PassResult:
        """Run the pass to its end, ignoring the intermediate events (the chunked track's use)."""
        async for item in self.events():
            if isinstance(item, PassResult):
                return item
        raise GatewayError(ErrorCode.ENGINE_ERROR, "The engine pass ended without a result.")

    def _parsed(self, deltas: list[TextDelta], closed: list[Segment], *, final: bool) -> list[TextEvent | SegmentEvent]:
        """Events in order; the tokens' log-probabilities ride on the next text event (all of them, once)."""
        items: list[TextEvent | SegmentEvent] = [TextEvent(d.text, d.segment) for d in deltas]
        if self._pending_logprobs and (items or final):
            logprobs = tuple(self._pending_logprobs)
            self._pending_logprobs = []
            if items and isinstance(items[0], TextEvent):
                items[0] = TextEvent(items[0].text, items[0].segment, logprobs)
            else:
                items.insert(0, TextEvent("", None, logprobs))
        items += [SegmentEvent(self._check(segment)) for segment in closed]
        return items

    def _check(self, segment: Segment) -> Segment:
        checked, anomaly, self.timeline = self.timeline.check(segment)
        self.checked.append(checked)
        if anomaly is not None:
            self.anomalies.append(anomaly)
        return checked

    def _collect_logprobs(self, update: GenerationUpdate) -> None:
        if self.stream_logprobs and update.logprobs:
            ids = update.token_ids_delta
            self._pending_logprobs += token_logprobs(ids, self.context.engine.token_bytes(ids), update.logprobs)

    async def _updates(self) -> AsyncIterator[GenerationUpdate]:
        """Engine updates with in-flight accounting, progress logs, evidence checkpoints and death handling."""
        context, request = self.context, self.request
        context.metrics.in_flight.inc()
        next_log = PROGRESS_EVERY_TOKENS
        started_generating = False
        try:
            stream = context.engine.generate(request)
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async for update in stream:
                    started_generating = True
                    if update.num_generated >= next_log:
                        next_log = (update.num_generated // PROGRESS_EVERY_TOKENS + 1) * PROGRESS_EVERY_TOKENS
                        logger.info(
                            "%s: %d/%d tokens%s", request.request_id, update.num_generated, request.max_tokens,
                            f" ({update.timings.summary()})" if update.timings is not None else "",
                        )
                    if context.capture_evidence:
                        self._checkpoint(update)
                    yield update
        except EngineDeadError as exc:
            raise self._engine_died(exc, started_generating) from exc
        finally:
            context.metrics.in_flight.dec()

    def _engine_died(self, exc: EngineDeadError, started_generating: bool) -> GatewayError:
        if not started_generating:
            # Nothing was generated for this request: it never really ran, so it is refused like any new one.
            return GatewayError(
                ErrorCode.ENGINE_NOT_READY,
                f"The engine is down ({exc}); the gateway is restarting it. Retry when GET /ready answers 200.",
                headers={"Retry-After": str(self.context.retry_after_s)},
            )
        return GatewayError(ErrorCode.ENGINE_ERROR, f"The engine died during the request ({exc}); the gateway is restarting it.")

    def _checkpoint(self, update: GenerationUpdate) -> None:
        """Progress samples for the evidence bundle, every N tokens or seconds."""
        now = time.monotonic()
        every = self.context.evidence
        if update.num_generated >= self._next_checkpoint_tokens or now >= self._next_checkpoint_at or update.finished:
            self._next_checkpoint_tokens = update.num_generated + every.checkpoint_every_tokens
            self._next_checkpoint_at = now + every.checkpoint_every_s
            elapsed = now - self.started
            self.checkpoints.append({
                "elapsed_s": round(elapsed, 4),
                "generated_tokens": update.num_generated,
                "tokens_per_s": round(update.num_generated / elapsed, 3) if elapsed > 0 else None,
            })

    def _result(self, final: GenerationUpdate, parsed: ParsedTranscript) -> PassResult:
        engine = self.context.engine
        if len(self.checked) != len(parsed.segments):
            raise GatewayError(ErrorCode.ENGINE_ERROR, "The transcript parser closed segments it did not report.")
        transcript = replace(parsed, segments=tuple(self.checked))
        stop = classify_pass_stop(engine, final, self.budget)
        ids = final.all_token_ids
        steps = final.all_logprobs
        logprobs = stats = None
        if steps is not None and len(steps) == len(ids):
            token_bytes = engine.token_bytes(ids)
            logprobs = token_logprobs(ids, token_bytes, steps)
            if self.want_segment_stats:
                stats = segment_stats(
                    raw=final.text, segments=transcript.segments, token_ids=ids, token_bytes=token_bytes,
                    steps=steps, end_token_ids=engine.eos_token_ids,
                    seek=0 if self.cut is None else int(round(self.cut.start_s * 100)),
                )
        return PassResult(
            request_id=self.request.request_id,
            cut=self.cut,
            budget=self.budget,
            final=final,
            transcript=transcript,
            stop=stop,
            coverage=measure_coverage(
                transcript, self.duration_s, speech=self.speech, anomalies=self.anomalies,
                min_gap_s=self.context.coverage.min_gap_s,
            ),
            token_logprobs=logprobs,
            segment_stats=stats,
            checkpoints=tuple(self.checkpoints),
            timestamp_anomalies=tuple(self.anomalies),
            last_64=self._last_64(ids) if self.context.capture_evidence else None,
        )

    def _last_64(self, ids: list[int]) -> dict[str, Any]:
        """The end of the generation as the bundle shows it: IDs, text, and text with special tokens."""
        engine, tail = self.context.engine, ids[-64:]
        return {
            "token_ids": tail,
            "text": engine.decode(tail, skip_special_tokens=True),
            "text_with_special_tokens": engine.decode(tail, skip_special_tokens=False),
        }


def classify_pass_stop(engine: TranscriptionEngine, final: GenerationUpdate, budget: TokenBudget) -> StopRecord:
    """The stop of one engine pass, from what the engine reported."""
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
