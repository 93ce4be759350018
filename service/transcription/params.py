"""What a client asked for, validated: the transcription request's parameters.

Plain frozen data shared by the HTTP layer (which parses forms into it) and the
pipeline (which only reads it), so the pipeline never sees a form field.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from service.longform import ChunkingPolicy


class ResponseFormat(str, enum.Enum):
    JSON = "json"
    TEXT = "text"
    VERBOSE_JSON = "verbose_json"
    SRT = "srt"
    VTT = "vtt"
    DIARIZED_JSON = "diarized_json"
    RTTM = "rttm"

    @property
    def can_stream(self) -> bool:
        """Server-sent events carry JSON events; subtitle and RTTM files only make sense whole."""
        return self in (ResponseFormat.JSON, ResponseFormat.TEXT, ResponseFormat.DIARIZED_JSON, ResponseFormat.VERBOSE_JSON)

    @property
    def needs_segment_stats(self) -> bool:
        """verbose_json reports per-segment log-probabilities, so the engine must return them."""
        return self is ResponseFormat.VERBOSE_JSON


#: How the audio is cut: `native` one pass; `chunked` asked for explicitly (a server_vad object);
#: `auto` lets the server decide (one pass when the audio fits it, chunks beyond).
TrackMode = Literal["native", "auto", "chunked"]


@dataclass(frozen=True)
class TrackChoice:
    mode: TrackMode
    policy: ChunkingPolicy


@dataclass(frozen=True)
class TranscriptionParams:
    """Validated fields of one request."""

    model: str | None
    instruction_override: str | None
    hotwords: tuple[str, ...]
    language: str | None
    languages: tuple[str, ...]
    response_format: ResponseFormat
    temperature: float
    timestamp_granularities: tuple[str, ...]
    stream: bool
    max_completion_tokens: int | None
    budget_field: str
    include_logprobs: bool
    track: TrackChoice
    #: `tail_recovery=auto`: a native pass that stops early with speech left is followed by further passes.
    tail_recovery: bool = False
    ignore_eos: bool = False  # admin-only: forces the full budget (benchmarks, tests)
    capture_evidence: bool = False  # admin-only: keep the full evidence bundle of this request
