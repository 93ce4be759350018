"""A transcription job (complete and immutable once prepared) and what it produced.

The job is planned in full before the engine sees it: the track, the cut plan
and every budget are decided up front, so nothing downstream fills in a
placeholder, and a job that cannot fit is refused before it costs anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from service.audio import DecodedAudio
from service.budget import TokenBudget
from service.engine.protocol import EngineTimings, GenerationUpdate
from service.evidence import Coverage, StopRecord, TimestampAnomaly
from service.longform import Cut, CutPlan
from service.speech import SpeechActivity
from service.transcript import ParsedTranscript, Segment
from service.transcription.params import TranscriptionParams

Track = Literal["native", "chunked", "native+recovery"]


@dataclass(frozen=True)
class NativePlan:
    """One engine pass over the whole audio."""

    budget: TokenBudget
    track: Track = "native"


@dataclass(frozen=True)
class ChunkedPlan:
    """Frozen cuts, each an engine pass with its own budget; `budget` is their sum."""

    cuts: CutPlan
    chunk_budgets: tuple[TokenBudget, ...]
    budget: TokenBudget
    track: Track = "chunked"


@dataclass(frozen=True)
class RecoveryPlan:
    """A native pass, then (only if it stops early with speech left) further passes over the rest.

    `budget` is the native pass's; each further pass gets its own budget when its
    cut is frozen (the cut depends on where the native pass stopped). The track
    is fixed here, before any token, so the stream's headers already say it.
    """

    budget: TokenBudget
    track: Track = "native+recovery"


@dataclass(frozen=True)
class TranscriptionJob:
    request_id: str
    params: TranscriptionParams
    audio: DecodedAudio
    instruction: str
    plan: NativePlan | ChunkedPlan | RecoveryPlan
    started: float
    received_at: str
    #: Where the audio holds sound (computed once at preparation): coverage is judged on speech, not time.
    speech: SpeechActivity

    @property
    def track(self) -> Track:
        return self.plan.track

    @property
    def budget(self) -> TokenBudget:
        return self.plan.budget


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token as OpenAI's `logprobs` entries describe it."""

    token: str
    bytes: list[int]
    logprob: float


@dataclass(frozen=True)
class SegmentStats:
    """Whisper's per-segment quantities, from this segment's own tokens (see `segment_stats`)."""

    tokens: tuple[int, ...]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    seek: int


@dataclass(frozen=True)
class PassResult:
    """One finished engine pass: the whole audio (native) or one chunk."""

    request_id: str
    cut: Cut | None
    budget: TokenBudget
    final: GenerationUpdate
    transcript: ParsedTranscript
    stop: StopRecord
    coverage: Coverage
    token_logprobs: tuple[TokenLogprob, ...] | None
    segment_stats: tuple[SegmentStats, ...] | None
    checkpoints: tuple[dict[str, Any], ...] = ()
    #: Segments (by this pass's local id) whose timestamps cannot be right; their times are clamped.
    timestamp_anomalies: tuple[TimestampAnomaly, ...] = ()
    #: Kept when evidence is captured: the last 64 token IDs and their text with and without special tokens.
    last_64: dict[str, Any] | None = None


@dataclass(frozen=True)
class ChunkedReport:
    """The chunked track's own evidence: cuts, stitching decisions, speaker links."""

    cut_plan: dict[str, Any]
    stitching: dict[str, Any]
    speakers: dict[str, Any]


#: Why the recovery track stopped adding passes.
RecoveryStop = Literal["not_needed", "covered", "no_progress", "max_passes"]


@dataclass(frozen=True)
class RecoveryPass:
    """One pass of the recovery track: where it started, and whether its segments were used."""

    result: PassResult
    #: Covered end (global seconds) before and after this pass.
    covered_before_s: float
    covered_after_s: float
    used: bool


@dataclass(frozen=True)
class RecoveryReport:
    """The recovery track's own evidence: the native pass's verdict, every further pass, why it stopped."""

    native_truncation: tuple[str, ...]
    native_coverage: Coverage
    passes: tuple[RecoveryPass, ...]
    stopped_because: RecoveryStop
    stitching: dict[str, Any]
    speakers: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    job: TranscriptionJob
    transcript: ParsedTranscript
    stop: StopRecord
    coverage: Coverage
    truncation: tuple[str, ...]
    timings: EngineTimings
    finished: float
    passes: tuple[PassResult, ...]
    segment_stats: tuple[SegmentStats, ...] | None
    chunked: ChunkedReport | None = None
    token_logprobs: tuple[TokenLogprob, ...] | None = field(default=None)
    #: Final segments (by final id) whose timestamps cannot be right: kept, clamped, never counted as coverage.
    timestamp_anomalies: tuple[TimestampAnomaly, ...] = ()
    recovery: RecoveryReport | None = None

    @property
    def truncated(self) -> bool:
        return bool(self.truncation)

    @property
    def total_s(self) -> float:
        """The job's start to its outcome: the `total` of the evidence and of `Server-Timing`."""
        return self.finished - self.job.started

    @property
    def raw_text(self) -> str:
        """The native pass's raw text (the recovery track's first pass is the native one)."""
        return "" if self.job.track == "chunked" else self.passes[0].final.text

    @property
    def token_ids(self) -> list[int]:
        return [] if self.job.track == "chunked" else self.passes[0].final.all_token_ids

    @property
    def generated_tokens(self) -> int:
        """Every pass's tokens (the recovery track's `stop` is the native pass's alone)."""
        return sum(p.stop.generated_tokens for p in self.passes)

    @property
    def prompt_tokens(self) -> int:
        if self.recovery is None:
            return self.job.budget.prompt_tokens
        return sum(p.budget.prompt_tokens for p in self.passes)


# -- what a running job reports ----------------------------------------------------


@dataclass(frozen=True)
class TextEvent:
    """Clean transcript text (adds up to the final `text`); `segment` is the segment id it belongs to."""

    text: str
    segment: int | None
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True)
class SegmentEvent:
    """A final segment (exactly as the response will list it)."""

    segment: Segment


@dataclass(frozen=True)
class ProgressEvent:
    """Audio covered by settled segments, over the duration."""

    covered_s: float
    duration_s: float


@dataclass(frozen=True)
class DoneEvent:
    outcome: Outcome


PipelineEvent = TextEvent | SegmentEvent | ProgressEvent | DoneEvent
