"""What one transcription request is while it runs (the job) and once it has run (the outcome)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from service.api.transcriptions.protocol import TranscriptionParams
from service.audio import DecodedAudio
from service.budget import TokenBudget
from service.engine.protocol import EngineTimings
from service.evidence import Coverage, StopRecord
from service.longform import CutPlan
from service.transcript import ParsedTranscript

logger = logging.getLogger(__name__)


TRACK_NATIVE = "native"


TRACK_CHUNKED = "chunked"


PROGRESS_EVERY_TOKENS = 256


#: Passes over this much audio report per-token progress (log lines) even when not streamed.
PROGRESS_AUDIO_S = 300.0


@dataclass
class PreparedJob:
    request_id: str
    params: TranscriptionParams
    audio: DecodedAudio
    budget: TokenBudget
    instruction: str
    started: float
    received_at: str
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    plan: CutPlan | None = None
    chunk_budgets: list[TokenBudget] = field(default_factory=list)

    @property
    def track(self) -> str:
        return TRACK_NATIVE if self.plan is None else TRACK_CHUNKED


@dataclass
class Outcome:
    job: PreparedJob
    raw_text: str
    token_ids: list[int]
    transcript: ParsedTranscript
    stop: StopRecord
    coverage: Coverage
    truncation: list[str]
    timings: EngineTimings
    finished: float
    extra: dict[str, Any] = field(default_factory=dict)  # the chunked track's own evidence

    @property
    def truncated(self) -> bool:
        return bool(self.truncation)


def wants_deltas(job: PreparedJob, pass_duration_s: float) -> bool:
    """Per-token updates only where someone uses them: streams, evidence, progress of long passes."""
    return job.params.stream or job.params.capture_evidence or pass_duration_s > PROGRESS_AUDIO_S


def placeholder_budget(duration_s: float) -> TokenBudget:
    """Replaced by the sum of the chunks' budgets once the cuts are planned."""
    return TokenBudget(
        duration_s=duration_s, audio_tokens=0, prompt_tokens=0, expected_output_tokens=0,
        conservative_output_tokens=0, context_room=0, max_tokens=0, source="default", fits_conservative=True,
        kv_bytes_bf16=0, max_model_len=0,
    )
