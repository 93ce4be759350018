"""Stop evidence: why a generation ended and how much of the audio it covers.

Classified from the engine's own outputs (finish reason, stop reason, the last
generated token), never guessed from the text: an operator must be able to tell
a model that chose to stop from a cap that stopped it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from service.speech import SpeechActivity
from service.transcript import ParsedTranscript, Segment

StopClass = Literal["eos", "stop_token", "max_tokens", "context_length", "aborted", "error", "unknown"]
STOP_CLASSES: tuple[StopClass, ...] = (
    "eos",
    "stop_token",
    "max_tokens",
    "context_length",
    "aborted",
    "error",
    "unknown",
)


@dataclass(frozen=True)
class StopRecord:
    stop: StopClass
    finish_reason: str | None
    stop_reason: int | str | None
    end_token_id: int | None
    end_token: str | None
    last_token_id: int | None
    generated_tokens: int
    max_tokens: int
    budget_left: int
    prompt_tokens: int
    max_model_len: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)  # scalar fields only: no recursive deep copy (asdict)


AnomalyKind = Literal["past_end", "backwards", "zero_length", "out_of_order", "overlap"]


@dataclass(frozen=True)
class TimestampAnomaly:
    """A segment whose times cannot be right; `start` and `end` are as the model wrote them.

    Policy (the same in every format): the segment is kept, with its words, so
    the streamed text and the final text stay one; its times are clamped to the
    audio (so no subtitle shows a time past the end of the file); it is listed
    here and never counts toward coverage.
    """

    segment: int
    start: float
    end: float
    kind: AnomalyKind
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Timeline:
    """What the clean segments so far establish; `check` judges the next segment against it.

    Immutable: each check returns the next timeline, so a pass, a stitched
    transcript and a test all apply exactly the same rules in the same order.
    Crosstalk is possible (two speakers at once), so only one speaker overlapping
    their own earlier segment counts as an impossible overlap.
    """

    duration_s: float
    tolerance_s: float
    last: Segment | None = None
    speaker_ends: tuple[tuple[str, float], ...] = ()

    def check(self, segment: Segment) -> tuple[Segment, TimestampAnomaly | None, Timeline]:
        duration, tol = self.duration_s, self.tolerance_s
        written_start = segment.start
        written_end = segment.written_end if segment.written_end is not None else segment.end
        clamped = replace(segment, start=min(segment.start, duration), end=min(segment.end, duration))
        kind: AnomalyKind | None = None
        detail = ""
        speaker_end = dict(self.speaker_ends).get(segment.speaker)
        if max(written_start, written_end) > duration + tol:
            kind, detail = "past_end", f"ends at {written_end:.2f} s, past the end of the audio ({duration:.2f} s)"
        elif segment.written_end is not None:
            kind, detail = "backwards", f"ends at {written_end:.2f} s, before its start {written_start:.2f} s"
        elif clamped.end <= clamped.start:
            kind, detail = "zero_length", f"starts and ends at {written_start:.2f} s"
        elif self.last is not None and clamped.start < self.last.start - tol:
            kind = "out_of_order"
            detail = f"starts at {written_start:.2f} s, before the previous segment's start {self.last.start:.2f} s"
        elif speaker_end is not None and clamped.start < speaker_end - tol:
            kind = "overlap"
            detail = f"{segment.speaker} starts at {written_start:.2f} s while still speaking until {speaker_end:.2f} s"
        if kind is not None:
            return clamped, TimestampAnomaly(segment.id, written_start, written_end, kind, detail), self
        ends = dict(self.speaker_ends) | {segment.speaker: max(clamped.end, speaker_end or 0.0)}
        return clamped, None, replace(self, last=clamped, speaker_ends=tuple(ends.items()))


def check_timestamps(
    segments: Sequence[Segment], duration_s: float, tolerance_s: float
) -> tuple[tuple[Segment, ...], tuple[TimestampAnomaly, ...]]:
    """All segments checked in order: the clamped segments and the anomalies found."""
    timeline = Timeline(duration_s, tolerance_s)
    checked: list[Segment] = []
    anomalies: list[TimestampAnomaly] = []
    for segment in segments:
        clamped, anomaly, timeline = timeline.check(segment)
        checked.append(clamped)
        if anomaly is not None:
            anomalies.append(anomaly)
    return tuple(checked), tuple(anomalies)


@dataclass(frozen=True)
class UncoveredSpan:
    """Audio no trustworthy segment covers: the head, a long inner gap, or the tail; with its sound seconds."""

    where: Literal["head", "gap", "tail"]
    start_s: float
    end_s: float
    speech_s: float


@dataclass(frozen=True)
class Coverage:
    """How far the transcript reaches, and how much speech it left out.

    `last_segment_end_s`, `coverage` and `uncovered_tail_s` are about time;
    `uncovered_speech_s` is the speech (see `service.speech`) in the tail and in
    inner gaps of at least `min_gap_s`: what `truncated` is decided on. Segments
    with a timestamp anomaly (`excluded_segments`) count for none of it.
    """

    audio_duration_s: float
    last_segment_end_s: float | None
    coverage: float
    uncovered_tail_s: float
    ends_inside_tag: bool
    incomplete_tail: str
    speech_s: float | None = None
    uncovered_speech_s: float = 0.0
    uncovered_tail_speech_s: float = 0.0
    uncovered: tuple[UncoveredSpan, ...] = ()
    excluded_segments: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Plain data; a shallow copy (asdict's deep copy cost a request path measurably) plus the spans."""
        return {
            **self.__dict__,
            "uncovered": [asdict(span) for span in self.uncovered],
            "excluded_segments": list(self.excluded_segments),
        }


def classify_stop(
    *,
    finish_reason: str | None,
    stop_reason: int | str | None,
    token_ids: list[int],
    eos_token_ids: tuple[int, ...],
    max_tokens: int,
    prompt_tokens: int,
    max_model_len: int,
    token_text: Any = None,
) -> StopRecord:
    """Name the stop from what the engine reported.

    vLLM reports `finish_reason="stop"` with `stop_reason=None` when it stopped
    on the tokenizer's EOS (the EOS is the last generated ID), and with the token
    ID when a stop token from the generation config ended it; `"length"` when the
    budget or the context ran out; `"abort"` when the request was aborted.
    """
    last = token_ids[-1] if token_ids else None
    generated = len(token_ids)
    end_token_id: int | None = None
    stop: StopClass
    if finish_reason == "stop":
        if isinstance(stop_reason, int):
            end_token_id = stop_reason
            stop = "eos" if stop_reason in eos_token_ids else "stop_token"
        elif stop_reason is None and last is not None and last in eos_token_ids:
            end_token_id, stop = last, "eos"
        elif isinstance(stop_reason, str):
            stop = "stop_token"
        else:
            stop = "unknown"
    elif finish_reason == "length":
        stop = "context_length" if prompt_tokens + generated >= max_model_len and generated < max_tokens else "max_tokens"
    elif finish_reason == "abort":
        stop = "aborted"
    elif finish_reason == "error":
        stop = "error"
    else:
        stop = "unknown"
    end_token = None
    if end_token_id is not None and token_text is not None:
        end_token = token_text(end_token_id)
    return StopRecord(
        stop=stop,
        finish_reason=finish_reason,
        stop_reason=stop_reason,
        end_token_id=end_token_id,
        end_token=end_token,
        last_token_id=last,
        generated_tokens=generated,
        max_tokens=max_tokens,
        budget_left=max(0, max_tokens - generated),
        prompt_tokens=prompt_tokens,
        max_model_len=max_model_len,
    )


def measure_coverage(
    transcript: ParsedTranscript,
    duration_s: float,
    *,
    speech: SpeechActivity | None = None,
    anomalies: Sequence[TimestampAnomaly] = (),
    min_gap_s: float = 3.0,
) -> Coverage:
    """Coverage by the segments with sound timestamps; without `speech`, every uncovered second counts as speech."""
    excluded = {a.segment for a in anomalies}
    spans = sorted(
        (max(0.0, s.start), min(duration_s, s.end)) for s in transcript.segments if s.id not in excluded
    )
    last_end = max((end for _, end in spans), default=None)
    covered = min(last_end or 0.0, duration_s)

    def sound(start: float, end: float) -> float:
        return round(end - start, 3) if speech is None else speech.seconds(start, end)

    uncovered: list[UncoveredSpan] = []
    reached = 0.0
    for start, end in spans:
        if start - reached >= min_gap_s:
            uncovered.append(UncoveredSpan("head" if reached == 0.0 else "gap", round(reached, 3), round(start, 3), sound(reached, start)))
        reached = max(reached, end)
    tail_speech = sound(covered, duration_s) if duration_s > covered else 0.0
    if duration_s > covered:
        uncovered.append(UncoveredSpan("tail" if spans else "head", round(covered, 3), round(duration_s, 3), tail_speech))
    return Coverage(
        audio_duration_s=round(duration_s, 3),
        last_segment_end_s=last_end,
        coverage=round(covered / duration_s, 4) if duration_s > 0 else 0.0,
        uncovered_tail_s=round(max(0.0, duration_s - covered), 3),
        ends_inside_tag=transcript.ends_inside_tag,
        incomplete_tail=transcript.incomplete_tail,
        speech_s=None if speech is None else speech.speech_s,
        uncovered_speech_s=round(sum(span.speech_s for span in uncovered), 3),
        uncovered_tail_speech_s=tail_speech,
        uncovered=tuple(span for span in uncovered if span.speech_s > 0),
        excluded_segments=tuple(sorted(excluded)),
    )


def truncation_reasons(stop: StopRecord, coverage: Coverage, *, margin_s: float) -> list[str]:
    """Why a response must be flagged truncated; empty when it is not.

    Uncovered time alone is not a reason (a recording may end in a minute of
    silence); uncovered speech beyond the margin is.
    """
    reasons: list[str] = []
    if stop.stop != "eos":
        reasons.append(f"stopped by {stop.stop}, not an end token")
    if coverage.uncovered_speech_s > margin_s:
        inner = round(coverage.uncovered_speech_s - coverage.uncovered_tail_speech_s, 3)
        reasons.append(
            f"{coverage.uncovered_speech_s:.2f} s of speech not covered by any segment "
            f"({coverage.uncovered_tail_speech_s:.2f} s after the last segment, {inner:.2f} s in gaps; margin {margin_s:g} s)"
        )
    if coverage.ends_inside_tag:
        reasons.append("text ends inside an unfinished tag")
    return reasons


def evidence_bundle_path(state_dir: Path, request_id: str) -> Path:
    """Where a request's full evidence bundle is kept (written by the accountant, read by the admin route)."""
    return state_dir / "evidence" / f"{request_id}.json"
