"""The two tracks: one native engine pass, or frozen chunks stitched into one transcript.

Both turn a planned job into the same events (clean text, final segments,
progress in audio time, then the outcome), so the stream, the final answer and
the accounting never ask which track ran. The chunked track is reported apart
(`track: chunked` everywhere) so that a chunked success never hides a native
failure; each chunk is one ordinary engine pass with its own stop evidence.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

from service.budget import TokenBudget
from service.engine.protocol import EngineTimings, GenerationRequest
from service.evidence import StopRecord, measure_coverage, truncation_reasons
from service.longform import ChunkTranscript, Cut, LinkedSpeakers, StitchedTranscript, link_speakers, stitch
from service.state import GatewayState
from service.transcript import ParsedTranscript, Segment, separator
from service.transcription.engine_pass import EnginePass, PassContext
from service.transcription.job import (
    ChunkedPlan,
    ChunkedReport,
    DoneEvent,
    NativePlan,
    Outcome,
    PassResult,
    PipelineEvent,
    ProgressEvent,
    SegmentEvent,
    SegmentStats,
    TextEvent,
    TranscriptionJob,
)
from service.transcription.segment_stats import TOP_LOGPROBS


class PassFactory:
    """Builds the engine pass of one span of a job (the whole audio, or one cut)."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    def build(self, job: TranscriptionJob, *, cut: Cut | None, budget: TokenBudget) -> EnginePass:
        engine = self.state.require_engine()
        settings = self.state.settings
        params = job.params
        audio, duration, request_id = job.audio.samples, job.audio.duration_s, job.request_id
        if cut is not None:
            first, last = cut.sample_span(job.audio.sample_rate)
            audio, duration, request_id = audio[first:last], cut.duration_s, f"{job.request_id}-c{cut.index}"
        stats = params.response_format.needs_segment_stats
        request = GenerationRequest(
            request_id=request_id,
            audio=audio,
            instruction=job.instruction,
            max_tokens=budget.max_tokens,
            temperature=params.temperature,
            ignore_eos=params.ignore_eos,
            want_logprobs=TOP_LOGPROBS if stats else (0 if params.include_logprobs else None),
            # Per-token updates only where someone reads them; final-only costs the event loop nothing per token.
            stream_deltas=(params.stream and cut is None) or params.capture_evidence,
        )
        context = PassContext(
            engine=engine,
            metrics=self.state.metrics,
            evidence=settings.evidence,
            retry_after_s=settings.limits.retry_after_s,
            capture_evidence=params.capture_evidence,
        )
        return EnginePass(
            context, request, budget=budget, duration_s=duration, cut=cut, segment_stats=stats,
            stream_logprobs=params.include_logprobs and params.stream,
        )


class NativeTrack:
    """One engine pass over the whole audio; its events pass straight through."""

    def __init__(self, passes: PassFactory, *, coverage_margin_s: float) -> None:
        self.passes = passes
        self.coverage_margin_s = coverage_margin_s

    async def events(self, job: TranscriptionJob, plan: NativePlan) -> AsyncIterator[PipelineEvent]:
        duration = job.audio.duration_s
        covered = 0.0
        result: PassResult | None = None
        async for item in self.passes.build(job, cut=None, budget=plan.budget).events():
            if isinstance(item, PassResult):
                result = item
                continue
            yield item
            if isinstance(item, SegmentEvent) and min(item.segment.end, duration) > covered:
                covered = min(item.segment.end, duration)
                yield ProgressEvent(covered, duration)
        assert result is not None  # EnginePass.events always ends with its result
        yield DoneEvent(self._conclude(job, result))

    def _conclude(self, job: TranscriptionJob, result: PassResult) -> Outcome:
        reasons = truncation_reasons(result.stop, result.coverage, margin_s=self.coverage_margin_s)
        return Outcome(
            job=job,
            transcript=result.transcript,
            stop=result.stop,
            coverage=result.coverage,
            truncation=tuple(reasons),
            timings=result.final.timings or EngineTimings(submitted=job.started),
            finished=time.monotonic(),
            passes=(result,),
            segment_stats=result.segment_stats,
            token_logprobs=result.token_logprobs,
        )


class ChunkedTrack:
    """Every chunk on the engine at once (bounded); segments stream as soon as no later chunk can change them."""

    def __init__(self, passes: PassFactory, *, coverage_margin_s: float, max_concurrent_chunks: int) -> None:
        self.passes = passes
        self.coverage_margin_s = coverage_margin_s
        self.max_concurrent_chunks = max_concurrent_chunks

    async def events(self, job: TranscriptionJob, plan: ChunkedPlan) -> AsyncIterator[PipelineEvent]:
        limit = asyncio.Semaphore(self.max_concurrent_chunks)

        async def run(cut: Cut, budget: TokenBudget) -> PassResult:
            async with limit:
                return await self.passes.build(job, cut=cut, budget=budget).result()

        tasks = [asyncio.create_task(run(cut, budget)) for cut, budget in zip(plan.cuts.cuts, plan.chunk_budgets, strict=True)]
        results: list[PassResult | None] = [None] * len(tasks)
        sent: list[Segment] = []
        text = ""
        try:
            for next_done in asyncio.as_completed(tasks):
                result = await next_done
                assert result.cut is not None
                results[result.cut.index] = result
                settled = settled_segments(results, plan)
                for segment in settled[len(sent):]:
                    piece = separator(text, segment.text) + segment.text
                    text += piece
                    sent.append(segment)
                    yield TextEvent(piece, segment.id)
                    yield SegmentEvent(segment)
                covered = sent[-1].end if sent else 0.0
                yield ProgressEvent(min(covered, job.audio.duration_s), job.audio.duration_s)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        done = [r for r in results if r is not None]
        yield DoneEvent(self._conclude(job, plan, done, sent))

    def _conclude(self, job: TranscriptionJob, plan: ChunkedPlan, chunks: list[PassResult], sent: list[Segment]) -> Outcome:
        stitched, linked = _stitch(chunks)
        notes = tuple(stitched.notes) + tuple(linked.notes)
        if tuple(sent) != linked.segments[: len(sent)]:
            notes += ("the stream sent segments that the final stitch changed",)
        transcript = ParsedTranscript.from_segments(linked.segments, notes)
        engine = self.passes.state.require_engine()
        coverage = measure_coverage(transcript, job.audio.duration_s)
        reasons = self._truncation(chunks, stitched, coverage.uncovered_tail_s)
        first_tokens = [c.final.timings.first_token for c in chunks if c.final.timings and c.final.timings.first_token]
        return Outcome(
            job=job,
            transcript=transcript,
            stop=aggregate_stop(chunks, engine.max_model_len),
            coverage=coverage,
            truncation=tuple(reasons),
            timings=EngineTimings(submitted=job.started, first_token=min(first_tokens, default=None), finished=time.monotonic()),
            finished=time.monotonic(),
            passes=tuple(chunks),
            segment_stats=_stitched_stats(stitched, chunks),
            chunked=ChunkedReport(
                cut_plan=plan.cuts.as_dict(),
                stitching={k: v for k, v in stitched.as_dict().items() if k not in ("segments", "text")},
                speakers=linked.as_dict(),
            ),
        )

    def _truncation(self, chunks: list[PassResult], stitched: StitchedTranscript, tail_s: float) -> list[str]:
        margin = self.coverage_margin_s
        reasons: list[str] = []
        for chunk in chunks:
            index = chunk.cut.index if chunk.cut is not None else 0
            if chunk.stop.stop != "eos":
                reasons.append(f"chunk {index} stopped by {chunk.stop.stop}, not an end token")
            if chunk.transcript.ends_inside_tag:
                reasons.append(f"chunk {index} text ends inside an unfinished tag")
        for gap in stitched.gaps:
            if gap.lost_s > margin:
                reasons.append(f"{gap.lost_s:.2f} s of audio lost after chunk {gap.chunk} ({gap.reason})")
        if tail_s > margin:
            reasons.append(f"{tail_s:.2f} s of audio after the last segment (margin {margin:g} s)")
        return reasons


def settled_segments(results: Sequence[PassResult | None], plan: ChunkedPlan) -> tuple[Segment, ...]:
    """Final segments no chunk still running can change: those of the finished leading chunks, before the next cut.

    Stitching only de-duplicates adjacent overlaps and speakers are labelled in
    order of first appearance, so the segments ending before the first
    unfinished chunk begins are the final answer's first segments.
    """
    done = 0
    while done < len(results) and results[done] is not None:
        done += 1
    if done == 0:
        return ()
    _, linked = _stitch([r for r in results[:done] if r is not None])
    if done == len(results):
        return linked.segments
    boundary = plan.cuts.cuts[done].start_s
    settled: list[Segment] = []
    for segment in linked.segments:
        if segment.end > boundary or segment.start >= boundary:
            break
        settled.append(segment)
    return tuple(settled)


def _stitch(chunks: Sequence[PassResult]) -> tuple[StitchedTranscript, LinkedSpeakers]:
    stitched = stitch([ChunkTranscript(cut=c.cut, transcript=c.transcript, stop=c.stop.stop) for c in chunks if c.cut])
    return stitched, link_speakers(stitched)


def _stitched_stats(stitched: StitchedTranscript, chunks: Sequence[PassResult]) -> tuple[SegmentStats, ...] | None:
    """Each kept segment's statistics, from the chunk pass that wrote it."""
    by_chunk = {c.cut.index: c.segment_stats for c in chunks if c.cut is not None}
    stats: list[SegmentStats] = []
    for segment in stitched.segments:
        chunk_stats = by_chunk.get(segment.chunk)
        if chunk_stats is None:
            return None
        stats.append(chunk_stats[segment.local_id])
    return tuple(stats)


def aggregate_stop(chunks: Sequence[PassResult], max_model_len: int) -> StopRecord:
    """The request's stop: `eos` only when every chunk ended on an end token, else the first chunk that did not."""
    odd = next((c.stop for c in chunks if c.stop.stop != "eos"), None)
    generated = sum(c.stop.generated_tokens for c in chunks)
    budget = sum(c.budget.max_tokens for c in chunks)
    return StopRecord(
        stop=odd.stop if odd else "eos",
        finish_reason=odd.finish_reason if odd else "stop",
        stop_reason=odd.stop_reason if odd else None,
        end_token_id=None if odd else chunks[-1].stop.end_token_id,
        end_token=None if odd else chunks[-1].stop.end_token,
        last_token_id=chunks[-1].stop.last_token_id,
        generated_tokens=generated,
        max_tokens=budget,
        budget_left=max(0, budget - generated),
        prompt_tokens=sum(c.stop.prompt_tokens for c in chunks),
        max_model_len=max_model_len,
    )
