"""Responses and stream events, built from openai-python's own types.

Pure functions of an outcome or an event: the types check every field OpenAI
defines, and our additions (`moss` evidence, `backend`, `speaker` on verbose
segments) ride along as the extra fields those models allow.
"""

from __future__ import annotations

from typing import Any

from openai.types.audio import (
    Transcription,
    TranscriptionDiarized,
    TranscriptionDiarizedSegment,
    TranscriptionSegment,
    TranscriptionTextDeltaEvent,
    TranscriptionTextDoneEvent,
    TranscriptionTextSegmentEvent,
    TranscriptionVerbose,
)
from openai.types.audio.transcription import Logprob, UsageTokens, UsageTokensInputTokenDetails
from openai.types.audio.transcription_verbose import Usage as UsageDuration

from service.errors import ErrorCode, GatewayError
from service.formats import render_rttm, render_srt, render_vtt
from service.state import BackendTag
from service.transcript import Segment
from service.transcription.job import (
    DoneEvent,
    Outcome,
    PipelineEvent,
    ProgressEvent,
    SegmentEvent,
    SegmentStats,
    TextEvent,
    TokenLogprob,
)
from service.transcription.params import ResponseFormat

MEDIA_TYPES = {
    ResponseFormat.TEXT: "text/plain",
    ResponseFormat.SRT: "application/x-subrip",
    ResponseFormat.VTT: "text/vtt",
    ResponseFormat.RTTM: "text/plain",
}


#: The response formats whose body carries the `moss` evidence object (the others have headers only).
EVIDENCE_FORMATS = frozenset({ResponseFormat.VERBOSE_JSON, ResponseFormat.DIARIZED_JSON})


def segment_id(segment: int) -> str:
    return f"seg_{segment}"


def usage_tokens(outcome: Outcome) -> dict[str, Any]:
    """OpenAI's token usage; each response type validates it into its own model of that shape."""
    prompt, audio = outcome.prompt_tokens, outcome.job.budget.audio_tokens
    generated = outcome.generated_tokens
    return UsageTokens(
        type="tokens",
        input_tokens=prompt,
        input_token_details=UsageTokensInputTokenDetails(audio_tokens=audio, text_tokens=prompt - audio),
        output_tokens=generated,
        total_tokens=prompt + generated,
    ).model_dump()


def logprob_entries(logprobs: tuple[TokenLogprob, ...] | None) -> list[dict[str, Any]] | None:
    """OpenAI's `logprobs` entries (token, its bytes, its log-probability)."""
    if logprobs is None:
        return None
    return [Logprob(token=entry.token, bytes=list(entry.bytes), logprob=entry.logprob).model_dump() for entry in logprobs]


def render_body(outcome: Outcome, backend: BackendTag, evidence: dict[str, Any]) -> dict[str, Any] | str:
    """The response body in the requested format (`evidence` is read for `EVIDENCE_FORMATS` only)."""
    params = outcome.job.params
    fmt, transcript = params.response_format, outcome.transcript
    if fmt is ResponseFormat.TEXT:
        return transcript.text
    if fmt is ResponseFormat.SRT:
        return render_srt(transcript.segments)
    if fmt is ResponseFormat.VTT:
        return render_vtt(transcript.segments)
    if fmt is ResponseFormat.RTTM:
        return render_rttm(transcript.segments, file_id=outcome.job.audio.sha256[:16])
    extras = {"backend": backend.as_dict()}
    duration = round(outcome.job.audio.duration_s, 3)
    body: Transcription | TranscriptionVerbose | TranscriptionDiarized
    if fmt is ResponseFormat.JSON:
        body = Transcription(
            text=transcript.text,
            usage=usage_tokens(outcome),
            logprobs=logprob_entries(outcome.token_logprobs) if params.include_logprobs else None,
            **extras,
        )
    elif fmt is ResponseFormat.VERBOSE_JSON:
        body = TranscriptionVerbose(
            duration=duration,
            language=params.language or (params.languages[0] if params.languages else "unknown"),
            text=transcript.text,
            segments=verbose_segments(outcome),
            usage=UsageDuration(type="duration", seconds=duration),
            task="transcribe",
            moss=evidence,
            **extras,
        )
    else:
        body = TranscriptionDiarized(
            duration=duration,
            task="transcribe",
            text=transcript.text,
            segments=[diarized_segment(segment) for segment in transcript.segments],
            usage=usage_tokens(outcome),
            moss=evidence,
            **extras,
        )
    return body.model_dump(mode="json", exclude_none=True)


def verbose_segments(outcome: Outcome) -> list[TranscriptionSegment]:
    segments = outcome.transcript.segments
    stats = outcome.segment_stats
    if stats is None or len(stats) != len(segments):
        raise GatewayError(
            ErrorCode.ENGINE_ERROR,
            "The engine returned no token log-probabilities for this transcript, so verbose_json cannot report them.",
        )
    temperature = outcome.job.params.temperature
    return [_verbose_segment(segment, stat, temperature) for segment, stat in zip(segments, stats, strict=True)]


def _verbose_segment(segment: Segment, stats: SegmentStats, temperature: float) -> TranscriptionSegment:
    return TranscriptionSegment(
        id=segment.id,
        seek=stats.seek,
        start=segment.start,
        end=segment.end,
        text=segment.text,
        tokens=list(stats.tokens),
        temperature=temperature,
        avg_logprob=stats.avg_logprob,
        compression_ratio=stats.compression_ratio,
        no_speech_prob=stats.no_speech_prob,
        speaker=segment.speaker,
    )


def segment_fields(segment: Segment) -> dict[str, Any]:
    """What OpenAI's diarized segment and its stream event share (the two types have the same fields)."""
    return {
        "type": "transcript.text.segment",
        "id": segment_id(segment.id),
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "speaker": segment.speaker,
    }


def diarized_segment(segment: Segment) -> TranscriptionDiarizedSegment:
    return TranscriptionDiarizedSegment(**segment_fields(segment))


def render_event(event: PipelineEvent, backend: BackendTag, evidence: dict[str, Any] | None) -> dict[str, Any]:
    """One stream event; `evidence` is the `moss` object, needed for the done event only."""
    if isinstance(event, TextEvent):
        model: Any = TranscriptionTextDeltaEvent(
            type="transcript.text.delta",
            delta=event.text,
            segment_id=None if event.segment is None else segment_id(event.segment),
            logprobs=logprob_entries(event.logprobs),
        )
    elif isinstance(event, SegmentEvent):
        model = TranscriptionTextSegmentEvent(**segment_fields(event.segment))
    elif isinstance(event, ProgressEvent):
        fraction = event.covered_s / event.duration_s if event.duration_s > 0 else 0.0
        return {
            "type": "moss.progress",
            "covered_s": round(event.covered_s, 3),
            "duration_s": round(event.duration_s, 3),
            "fraction": round(min(1.0, fraction), 4),
        }
    else:
        model = done_event(event, backend, evidence or {})
    return model.model_dump(mode="json", exclude_none=True)  # type: ignore[no-any-return]


def done_event(event: DoneEvent, backend: BackendTag, evidence: dict[str, Any]) -> TranscriptionTextDoneEvent:
    """OpenAI's `transcript.text.done`, with the stop evidence (`moss`) and the backend."""
    outcome = event.outcome
    return TranscriptionTextDoneEvent(
        type="transcript.text.done",
        text=outcome.transcript.text,
        usage=usage_tokens(outcome),  # validated into the event's own usage model
        logprobs=logprob_entries(outcome.token_logprobs) if outcome.job.params.include_logprobs else None,
        backend=backend.as_dict(),
        moss=evidence,
    )


def evidence_headers(outcome: Outcome, backend: BackendTag) -> dict[str, str]:
    """The stop evidence and the backend in headers, for every non-streamed answer."""
    plan_sha = outcome.chunked.cut_plan.get("sha256", "") if outcome.chunked is not None else ""
    recovery = outcome.recovery
    extra = {} if recovery is None else {
        "X-Moss-Native-Truncated": "true" if recovery.native_truncation else "false",
        "X-Moss-Recovery-Passes": str(len(recovery.passes)),
        "X-Moss-Recovery-Stop": recovery.stopped_because,
    }
    return {
        **stream_headers(outcome.job.request_id, outcome.job.track, backend),
        "X-Moss-Cut-Plan-Sha256": str(plan_sha),
        "X-Moss-Stop": outcome.stop.stop,
        "X-Moss-Truncated": "true" if outcome.truncated else "false",
        "X-Moss-Generated-Tokens": str(outcome.generated_tokens),
        "X-Moss-Max-Tokens": str(outcome.job.budget.max_tokens),
        "X-Moss-Coverage": f"{outcome.coverage.coverage:.4f}",
        "X-Moss-Uncovered-Tail-S": f"{outcome.coverage.uncovered_tail_s:.3f}",
        "X-Moss-Uncovered-Speech-S": f"{outcome.coverage.uncovered_speech_s:.3f}",
        "X-Moss-Timestamp-Anomalies": str(len(outcome.timestamp_anomalies)),
        "Server-Timing": server_timing(outcome),
        **extra,
    }


def server_timing(outcome: Outcome) -> str:
    """Where the request's time went, as a W3C `Server-Timing` value (milliseconds; browsers show it).

    `prepare`: decoding, the speech detector and the plan, until the engine pass was submitted (the
    chunked and recovery tracks submit from the job's start, so theirs is 0); `features`: the renderer's
    queue and feature extraction; `queue`, `prefill`, `decode`: the engine core's own clock, where it
    reports them; `total`: the job's start to its outcome. A load test reads it to split a request's
    latency between the gateway and the engine (bench.client keeps it per request).
    """
    timings = outcome.timings
    phases = (
        ("prepare", max(0.0, timings.submitted - outcome.job.started)),
        ("features", timings.render_s),
        ("queue", timings.engine_queue_s),
        ("prefill", timings.engine_prefill_s),
        ("decode", timings.engine_decode_s),
        ("total", outcome.total_s),
    )
    return ", ".join(f"{name};dur={seconds * 1000:.1f}" for name, seconds in phases if seconds is not None)


def stream_headers(request_id: str, track: str, backend: BackendTag) -> dict[str, str]:
    """What is known before the first event: the request, its track and the backend."""
    return {
        "X-Request-Id": request_id,
        "X-Moss-Track": track,
        "X-Moss-Backend-Fingerprint": backend.fingerprint or "",
        "X-Moss-Qualification-Id": backend.qualification_id or "",
    }
