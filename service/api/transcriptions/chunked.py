"""The chunked track: frozen cuts, chunks on the engine at once, one stitched transcript.

Asked for with `chunking_strategy`; never chosen silently, and reported apart
(`track: chunked` on the response, the ledger line and every metric) so that a
chunked success never hides a native failure. Each chunk is one ordinary engine
pass with its own budget and stop evidence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Any

from service.api.transcriptions.jobs import Outcome, PreparedJob, wants_deltas
from service.api.transcriptions.serving import TranscriptionService
from service.budget import TokenBudget
from service.engine.protocol import EngineTimings, GenerationRequest, GenerationUpdate
from service.errors import ErrorCode, GatewayError
from service.evidence import Coverage, StopRecord, measure_coverage
from service.longform import ChunkTranscript, Cut, link_speakers, plan_cuts, stitch
from service.transcript import ParsedTranscript, parse_transcript


@dataclass
class ChunkResult:
    cut: Cut
    request_id: str
    budget: TokenBudget
    final: GenerationUpdate
    transcript: ParsedTranscript
    stop: StopRecord
    coverage: Coverage


async def plan_job(service: TranscriptionService, job: PreparedJob) -> None:
    """Freeze the cut list and give each chunk its own budget (refusing up front if one cannot fit)."""
    policy = job.params.chunking
    assert policy is not None
    audio = job.audio
    plan = await asyncio.to_thread(
        plan_cuts, audio.samples, audio.sample_rate, policy=policy, audio_sha256=audio.sha256
    )
    budgets = []
    for cut in plan.cuts:
        first, last = cut.sample_span(audio.sample_rate)
        budgets.append(service._budget(last - first, job.instruction, job.params.max_completion_tokens))
    job.plan = plan
    job.chunk_budgets = budgets
    job.budget = _sum_budgets(audio.duration_s, budgets)


def _sum_budgets(duration_s: float, budgets: list[TokenBudget]) -> TokenBudget:
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


async def _run_chunk(
    service: TranscriptionService, job: PreparedJob, cut: Cut, budget: TokenBudget, gate: asyncio.Semaphore
) -> ChunkResult:
    first, last = cut.sample_span(job.audio.sample_rate)
    request = GenerationRequest(
        request_id=f"{job.request_id}-c{cut.index}-{uuid.uuid4().hex[:6]}",
        audio=job.audio.samples[first:last],
        instruction=job.instruction,
        max_tokens=budget.max_tokens,
        temperature=job.params.temperature,
        ignore_eos=job.params.ignore_eos,
        stream_deltas=wants_deltas(job, cut.duration_s),
    )
    final: GenerationUpdate | None = None
    async with gate:
        async for update in service._updates(job, request):
            if update.finished:
                final = update
    if final is None:
        raise GatewayError(ErrorCode.ENGINE_ERROR, f"The engine ended chunk {cut.index} without a final output.")
    transcript = parse_transcript(final.text)
    stop = service.classify(final, budget)
    return ChunkResult(
        cut=cut, request_id=request.request_id, budget=budget, final=final, transcript=transcript, stop=stop,
        coverage=measure_coverage(transcript, cut.duration_s),
    )


def _aggregate_stop(chunks: list[ChunkResult], max_model_len: int) -> StopRecord:
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


async def run_chunked(service: TranscriptionService, job: PreparedJob) -> Outcome:
    """Every chunk on the engine (at most `longform.max_concurrent_chunks` at once), stitched and linked."""
    assert job.plan is not None
    gate = asyncio.Semaphore(service.state.settings.longform.max_concurrent_chunks)
    tasks = [
        asyncio.create_task(_run_chunk(service, job, cut, budget, gate))
        for cut, budget in zip(job.plan.cuts, job.chunk_budgets, strict=True)
    ]
    try:
        chunks = list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    stitched = stitch([ChunkTranscript(cut=c.cut, transcript=c.transcript, stop=c.stop.stop) for c in chunks])
    linked = link_speakers(stitched)
    segments = tuple(dataclasses.replace(segment, id=index) for index, segment in enumerate(linked.segments))
    transcript = ParsedTranscript(
        segments=segments, incomplete_tail="", tail_text="", ends_inside_tag=False, stray_text=(),
        anomalies=tuple(stitched.notes) + tuple(linked.notes),
    )
    engine = service.state.require_engine()
    stop = _aggregate_stop(chunks, engine.max_model_len)
    coverage = measure_coverage(transcript, job.audio.duration_s)
    margin = service.state.settings.budget.coverage_margin_s
    reasons: list[str] = []
    for chunk in chunks:
        if chunk.stop.stop != "eos":
            reasons.append(f"chunk {chunk.cut.index} stopped by {chunk.stop.stop}, not an end token")
        if chunk.transcript.ends_inside_tag:
            reasons.append(f"chunk {chunk.cut.index} text ends inside an unfinished tag")
    for gap in stitched.gaps:
        if gap.lost_s > margin:
            reasons.append(f"{gap.lost_s:.2f} s of audio lost after chunk {gap.chunk} ({gap.reason})")
    if coverage.uncovered_tail_s > margin:
        reasons.append(f"{coverage.uncovered_tail_s:.2f} s of audio after the last segment (margin {margin:g} s)")
    first_token = min((c.final.timings.first_token for c in chunks if c.final.timings and c.final.timings.first_token), default=None)
    timings = EngineTimings(submitted=job.started, first_token=first_token, finished=time.monotonic())
    summaries = [_chunk_summary(c) for c in chunks]
    extra: dict[str, Any] = {
        "cut_plan": job.plan.as_dict(),
        "chunks": [
            {**summary, "raw_text": c.final.text, "local_segments": [dataclasses.asdict(s) for s in c.transcript.segments]}
            for summary, c in zip(summaries, chunks, strict=True)
        ],
        "stitching": {k: v for k, v in stitched.as_dict().items() if k not in ("segments", "text")},
        "speakers": linked.as_dict(),
        "chunk_summaries": summaries,
    }
    return Outcome(
        job=job,
        raw_text="",
        token_ids=[],
        transcript=transcript,
        stop=stop,
        coverage=coverage,
        truncation=reasons,
        timings=timings,
        finished=time.monotonic(),
        extra=extra,
    )


def _chunk_summary(chunk: ChunkResult) -> dict[str, Any]:
    return {
        "index": chunk.cut.index,
        "start_s": chunk.cut.start_s,
        "end_s": chunk.cut.end_s,
        "request_id": chunk.request_id,
        "stop": chunk.stop.as_dict(),
        "budget": chunk.budget.as_dict(),
        "coverage": chunk.coverage.as_dict(),
        "tokens": {"prompt": chunk.budget.prompt_tokens, "generated": chunk.stop.generated_tokens},
    }
