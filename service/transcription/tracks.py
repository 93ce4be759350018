"""The two tracks: one native engine pass, or frozen chunks stitched into one transcript.

Both turn a planned job into the same events (clean text, final segments,
progress in audio time, then the outcome), so the stream, the final answer and
the accounting never ask which track ran. The chunked track is reported apart
(`track: chunked` everywhere) so that a chunked success never hides a native
failure; each chunk is one ordinary engine pass with its own stop evidence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence

from service.budget import BudgetPolicy, EngineLimits, TokenBudget, plan_budget
from service.engine.protocol import EngineTimings, GenerationRequest
from service.evidence import StopRecord, TimestampAnomaly, measure_coverage, truncation_reasons
from service.longform import (
    ChunkTranscript,
    Cut,
    LinkedSpeakers,
    StitchedTranscript,
    link_speakers,
    stitch,
)
from service.settings import CoverageSettings
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
    RecoveryPass,
    RecoveryPlan,
    RecoveryReport,
    RecoveryStop,
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

    def build(
        self, job: TranscriptionJob, *, cut: Cut | None, budget: TokenBudget, rank: int | None = None
    ) -> EnginePass:
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
            data_parallel_rank=rank,
        )
        context = PassContext(
            engine=engine,
            metrics=self.state.metrics,
            evidence=settings.evidence,
            coverage=settings.coverage,
            retry_after_s=settings.limits.retry_after_s,
            capture_evidence=params.capture_evidence,
        )
        speech = job.speech if cut is None else job.speech.window(cut.start_s, cut.end_s)
        return EnginePass(
            context, request, budget=budget, duration_s=duration, cut=cut, speech=speech, segment_stats=stats,
            stream_logprobs=params.include_logprobs and params.stream,
        )

    def budget(self, num_samples: int, instruction: str, requested: int | None) -> TokenBudget:
        """The output budget of one engine pass over `num_samples` of audio."""
        return pass_budget(self.state, num_samples, instruction, requested)


def pass_budget(state: GatewayState, num_samples: int, instruction: str, requested: int | None) -> TokenBudget:
    """The output budget of one engine pass over `num_samples` of audio (planning and recovery alike)."""
    engine = state.require_engine()
    settings = state.settings
    return plan_budget(
        duration_s=num_samples / engine.sample_rate,
        num_samples=num_samples,
        prompt_tokens=engine.count_prompt_tokens(num_samples, instruction),
        requested_max_tokens=requested,
        policy=BudgetPolicy(
            observed_tokens_per_second=settings.budget.observed_tokens_per_second,
            conservative_tokens_per_second=settings.budget.conservative_tokens_per_second,
            minimum_budget=settings.budget.minimum_budget,
        ),
        limits=EngineLimits(
            max_model_len=engine.max_model_len,
            encoder_budget_tokens=settings.effective_max_num_batched_tokens,
            kv_bytes_per_token_bf16=engine.kv_bytes_per_token_bf16,
        ),
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
        return single_pass_outcome(job, result, coverage_margin_s=self.coverage_margin_s)


def chunk_rank(index: int, data_parallel_size: int) -> int | None:
    """The data-parallel rank of chunk `index`: round robin over the ranks, None without data parallelism.

    Why explicit: vLLM balances by the queue lengths it last saw, and a program's
    chunks all arrive at once, before any rank reports load; pinning chunk i to
    rank i % N puts an equal share of the program on every GPU from the start.
    """
    return index % data_parallel_size if data_parallel_size > 1 else None


class ChunkedTrack:
    """Every chunk on the engine at once (bounded); segments stream as soon as no later chunk can change them."""

    def __init__(self, passes: PassFactory, *, coverage_margin_s: float, max_concurrent_chunks: int) -> None:
        self.passes = passes
        self.coverage_margin_s = coverage_margin_s
        self.max_concurrent_chunks = max_concurrent_chunks

    async def events(self, job: TranscriptionJob, plan: ChunkedPlan) -> AsyncIterator[PipelineEvent]:
        limit = asyncio.Semaphore(self.max_concurrent_chunks)
        ranks = self.passes.state.require_engine().data_parallel_size

        async def run(cut: Cut, budget: TokenBudget) -> PassResult:
            async with limit:
                return await self.passes.build(job, cut=cut, budget=budget, rank=chunk_rank(cut.index, ranks)).result()

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
        anomalies = map_anomalies([(s.chunk, s.local_id) for s in stitched.segments], chunks)
        coverage = measure_coverage(
            transcript, job.audio.duration_s, speech=job.speech, anomalies=anomalies,
            min_gap_s=self.passes.state.settings.coverage.min_gap_s,
        )
        reasons = self._truncation(job, chunks, stitched, coverage.uncovered_speech_s)
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
            timestamp_anomalies=anomalies,
            chunked=ChunkedReport(
                cut_plan=plan.cuts.as_dict(),
                stitching={k: v for k, v in stitched.as_dict().items() if k not in ("segments", "text")},
                speakers=linked.as_dict(),
            ),
        )

    def _truncation(
        self, job: TranscriptionJob, chunks: list[PassResult], stitched: StitchedTranscript, speech_left_s: float
    ) -> list[str]:
        margin = self.coverage_margin_s
        reasons: list[str] = []
        for chunk in chunks:
            index = chunk.cut.index if chunk.cut is not None else 0
            if chunk.stop.stop != "eos":
                reasons.append(f"chunk {index} stopped by {chunk.stop.stop}, not an end token")
            if chunk.transcript.ends_inside_tag:
                reasons.append(f"chunk {index} text ends inside an unfinished tag")
        for gap in stitched.gaps:
            lost_speech = job.speech.seconds(gap.start_s, gap.start_s + gap.lost_s)
            if lost_speech > margin:
                reasons.append(f"{lost_speech:.2f} s of speech lost after chunk {gap.chunk} ({gap.reason})")
        if speech_left_s > margin:
            reasons.append(f"{speech_left_s:.2f} s of speech not covered by any segment (margin {margin:g} s)")
        return reasons


class RecoveryTrack:
    """`tail_recovery=auto`: the native pass, then further passes over the tail it left, stitched like chunks.

    Why a track of its own: a recovered transcript is not a native success, so it
    is reported as `native+recovery` everywhere, and the native pass's own stop
    evidence stays in the answer as it was (`stop`; `recovery.native` keeps its
    coverage and verdict). Further passes run one after the other, each from a
    frozen cut `recovery_back_off_s` before the furthest settled segment so far
    ends, until no speech is left after the covered end, a pass moves that end by
    less than `recovery_min_progress_s` (its segments are then not used), or
    `recovery_max_passes`. They are stitched with the chunked track's overlap
    de-duplication and speaker linking.

    Why segments stream only once they are settled: the final answer must equal
    the stream. A native segment ending `recovery_back_off_s` before the furthest
    settled end so far lies before every cut a later pass can take, so no stitch
    can drop or change it; the others wait until the passes are done. Native
    speaker labels are kept as written; a later pass's speaker linked to one of
    them takes that label, an unlinked one a new label.
    """

    def __init__(self, passes: PassFactory, *, coverage_margin_s: float, settings: CoverageSettings) -> None:
        self.passes = passes
        self.coverage_margin_s = coverage_margin_s
        self.settings = settings

    async def events(self, job: TranscriptionJob, plan: RecoveryPlan) -> AsyncIterator[PipelineEvent]:
        duration, back_off = job.audio.duration_s, self.settings.recovery_back_off_s
        native_pass = self.passes.build(job, cut=None, budget=plan.budget)
        held: list[Segment] = []
        sent = 0
        text = ""
        furthest = 0.0
        native: PassResult | None = None
        async for item in native_pass.events():
            if isinstance(item, PassResult):
                native = item
            elif isinstance(item, SegmentEvent):
                held.append(item.segment)
                if item.segment.id not in {a.segment for a in native_pass.anomalies}:
                    furthest = max(furthest, item.segment.end)
                while held and held[0].end <= furthest - back_off:
                    segment = held.pop(0)
                    piece = separator(text, segment.text) + segment.text
                    text, sent = text + piece, sent + 1
                    yield TextEvent(piece, segment.id)
                    yield SegmentEvent(segment)
                    yield ProgressEvent(min(furthest, duration), duration)
        assert native is not None  # EnginePass.events always ends with its result
        if native.coverage.uncovered_tail_speech_s <= self.coverage_margin_s:
            outcome = self._unrecovered(job, native)
        else:
            passes, why = await self._recover(job, native)
            outcome = self._conclude(job, native, passes, why, streamed=sent)
        for segment in outcome.transcript.segments[sent:]:
            piece = separator(text, segment.text) + segment.text
            text += piece
            yield TextEvent(piece, segment.id)
            yield SegmentEvent(segment)
        final_text = outcome.transcript.text
        if len(final_text) > len(text) and final_text.startswith(text):  # the native pass's unfinished tail
            yield TextEvent(final_text[len(text):], None)
        yield ProgressEvent(min(outcome.coverage.last_segment_end_s or 0.0, duration), duration)
        yield DoneEvent(outcome)

    async def _recover(self, job: TranscriptionJob, native: PassResult) -> tuple[list[RecoveryPass], RecoveryStop]:
        """Further passes until no speech is left, a pass makes no progress, or the pass limit."""
        settings, duration = self.settings, job.audio.duration_s
        covered = native.coverage.last_segment_end_s or 0.0
        minimum = self.passes.state.settings.audio.min_duration_s
        done: list[RecoveryPass] = []
        for index in range(1, settings.recovery_max_passes + 1):
            start = round(max(0.0, covered - settings.recovery_back_off_s), 3)
            if duration - start < minimum:
                return done, "covered"
            cut = Cut(index, start, round(duration, 3))
            first, last = cut.sample_span(job.audio.sample_rate)
            budget = self.passes.budget(last - first, job.instruction, job.params.max_completion_tokens)
            result = await self.passes.build(job, cut=cut, budget=budget).result()
            reached = round(start + (result.coverage.last_segment_end_s or 0.0), 3)
            if reached - covered < settings.recovery_min_progress_s:
                done.append(RecoveryPass(result, covered, covered, used=False))
                return done, "no_progress"
            done.append(RecoveryPass(result, covered, reached, used=True))
            covered = reached
            if result.coverage.uncovered_tail_speech_s <= self.coverage_margin_s:
                return done, "covered"
        return done, "max_passes"

    def _conclude(
        self, job: TranscriptionJob, native: PassResult, passes: list[RecoveryPass], why: RecoveryStop, *, streamed: int
    ) -> Outcome:
        duration = job.audio.duration_s
        used = [native] + [p.result for p in passes if p.used]
        whole = Cut(0, 0.0, round(duration, 3))
        stitched = stitch([
            ChunkTranscript(cut=r.cut or whole, transcript=r.transcript, stop=r.stop.stop) for r in used
        ])
        linked = link_speakers(stitched)
        first_cut = used[1].cut.start_s if len(used) > 1 and used[1].cut is not None else duration
        prefix = list(native.transcript.segments[:streamed])  # already streamed: kept exactly as sent
        for segment in native.transcript.segments[streamed:]:  # settled before every cut: no stitch changes them
            if segment.end > first_cut:
                break
            prefix.append(segment)
        kept = {(0, s.id) for s in prefix}
        rest = [s for s in stitched.segments if (s.chunk, s.local_id) not in kept]
        labels = native_labels(linked, native.transcript.speakers)
        segments = tuple(prefix) + tuple(
            Segment(len(prefix) + n, s.start, s.end, labels[(s.chunk, s.speaker)], s.text) for n, s in enumerate(rest)
        )
        origins = [(0, s.id) for s in prefix] + [(s.chunk, s.local_id) for s in rest]
        anomalies = map_anomalies(origins, used)
        transcript = ParsedTranscript.from_segments(segments, tuple(stitched.notes) + tuple(linked.notes))
        coverage = measure_coverage(
            transcript, duration, speech=job.speech, anomalies=anomalies, min_gap_s=self.settings.min_gap_s
        )
        last = used[-1]
        first_token = native.final.timings.first_token if native.final.timings else None
        return Outcome(
            job=job,
            transcript=transcript,
            stop=native.stop,
            coverage=coverage,
            truncation=tuple(truncation_reasons(last.stop, coverage, margin_s=self.coverage_margin_s)),
            timings=EngineTimings(submitted=job.started, first_token=first_token, finished=time.monotonic()),
            finished=time.monotonic(),
            passes=(native, *(p.result for p in passes)),
            segment_stats=origin_stats(origins, used),
            timestamp_anomalies=anomalies,
            recovery=RecoveryReport(
                native_truncation=tuple(truncation_reasons(native.stop, native.coverage, margin_s=self.coverage_margin_s)),
                native_coverage=native.coverage,
                passes=tuple(passes),
                stopped_because=why,
                stitching={k: v for k, v in stitched.as_dict().items() if k not in ("segments", "text")},
                speakers=linked.as_dict(),
            ),
        )

    def _unrecovered(self, job: TranscriptionJob, native: PassResult) -> Outcome:
        """No speech left after the native pass: its answer, reported on this track."""
        outcome = single_pass_outcome(job, native, coverage_margin_s=self.coverage_margin_s)
        report = RecoveryReport(outcome.truncation, native.coverage, (), "not_needed", {}, {})
        return dataclasses.replace(outcome, recovery=report)


def native_labels(linked: LinkedSpeakers, native_speakers: Sequence[str]) -> dict[tuple[int, str], str]:
    """Labels for every (pass, local speaker): the native pass's own, or new ones after its highest."""
    own = {label: local for (index, local), label in linked.mapping.items() if index == 0}
    numbers = [int(s[1:]) for s in native_speakers if s[1:].isdigit()]
    following = max(numbers, default=0) + 1
    fresh: dict[str, str] = {}
    labels: dict[tuple[int, str], str] = {}
    for node, label in linked.mapping.items():
        if label in own:
            labels[node] = own[label]
            continue
        if label not in fresh:
            fresh[label] = f"S{following:02d}"
            following += 1
        labels[node] = fresh[label]
    return labels


def single_pass_outcome(job: TranscriptionJob, result: PassResult, *, coverage_margin_s: float) -> Outcome:
    """The answer of one engine pass over the whole audio (the native track's, and recovery's when no tail is left)."""
    return Outcome(
        job=job,
        transcript=result.transcript,
        stop=result.stop,
        coverage=result.coverage,
        truncation=tuple(truncation_reasons(result.stop, result.coverage, margin_s=coverage_margin_s)),
        timings=result.final.timings or EngineTimings(submitted=job.started),
        finished=time.monotonic(),
        passes=(result,),
        segment_stats=result.segment_stats,
        token_logprobs=result.token_logprobs,
        timestamp_anomalies=result.timestamp_anomalies,
    )


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
    return origin_stats([(s.chunk, s.local_id) for s in stitched.segments], chunks)


def origin_stats(origins: Sequence[tuple[int, int]], passes: Sequence[PassResult]) -> tuple[SegmentStats, ...] | None:
    """Statistics of segments given by (pass index, local id); None when any pass kept none."""
    by_pass = {0 if p.cut is None else p.cut.index: p.segment_stats for p in passes}
    stats: list[SegmentStats] = []
    for index, local in origins:
        pass_stats = by_pass.get(index)
        if pass_stats is None:
            return None
        stats.append(pass_stats[local])
    return tuple(stats)


def map_anomalies(origins: Sequence[tuple[int, int]], passes: Sequence[PassResult]) -> tuple[TimestampAnomaly, ...]:
    """Each pass's timestamp anomalies, renumbered to the final segments (given by origin) and moved to global time."""
    found = {
        (0 if p.cut is None else p.cut.index, a.segment): (a, 0.0 if p.cut is None else p.cut.start_s)
        for p in passes
        for a in p.timestamp_anomalies
    }
    mapped: list[TimestampAnomaly] = []
    for final_id, origin in enumerate(origins):
        hit = found.get(origin)
        if hit is not None:
            anomaly, offset = hit
            mapped.append(
                TimestampAnomaly(final_id, round(anomaly.start + offset, 3), round(anomaly.end + offset, 3), anomaly.kind, anomaly.detail)
            )
    return tuple(mapped)


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
