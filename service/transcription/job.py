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
from service.evidence import Coverage, StopRecord
from service.longform import Cut, CutPlan
from service.transcript import ParsedTranscript, Segment
from service.transcription.params import TranscriptionParams

Track = Literal["native", "chunked"]


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
class TranscriptionJob:
    request_id: str
    params: TranscriptionParams
    audio: DecodedAudio
    instruction: str
    plan: NativePlan | ChunkedPlan
    started: float
    received_at: str

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
    #: Kept when evidence is captured: the last 64 token IDs and their text with and without special tokens.
    last_64: dict[str, Any] | None = None


@dataclass(frozen=True)
class ChunkedReport:
    """The chunked track's own evidence: cuts, stitching decisions, speaker links."""

    cut_plan: dict[str, Any]
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

    @property
    def truncated(self) -> bool:
        return bool(self.truncation)

    @property
    def raw_text(self) -> str:
        return self.passes[0].final.text if self.job.track == "native" else ""

    @property
    def token_ids(self) -> list[int]:
        return self.passes[0].final.all_token_ids if self.job.track == "native" else []


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
