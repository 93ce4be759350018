"""The small interface between the gateway and an inference engine.

The gateway needs more than text from the engine: the generated token IDs, the
finish and stop reasons and the prompt length are the stop evidence every
response carries. Both the real vLLM engine and the unit tests' fake engine
implement `TranscriptionEngine`; nothing else in the gateway knows about vLLM.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

#: What the engine says about why a sequence ended (vLLM's own words).
FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True)
class GenerationRequest:
    """One transcription job as the engine sees it."""

    request_id: str
    audio: np.ndarray  # float32, mono, at the engine's sample rate
    instruction: str
    max_tokens: int
    temperature: float = 0.0
    ignore_eos: bool = False
    #: None: no log-probabilities; k: the sampled token's and the top-k of every step.
    want_logprobs: int | None = None
    #: False: the engine reports only the final output (no per-token updates to the gateway's event
    #: loop, which costs throughput at high concurrency); True for streams, progress and evidence.
    stream_deltas: bool = True
    #: With vLLM data parallelism: the engine copy (rank) that runs this request; None lets vLLM
    #: balance. Qualification pins its runs to each rank in turn, and the chunked track spreads a
    #: long program's chunks over the ranks, so that every GPU works on it at once.
    data_parallel_rank: int | None = None


@dataclass
class EngineTimings:
    """Monotonic timestamps (seconds) taken by the engine adapter."""

    submitted: float
    #: When the prompt's audio features were ready and the request went to the engine.
    rendered: float | None = None
    first_token: float | None = None
    finished: float | None = None
    #: From the engine core's own clock, when the engine reports them.
    engine_queue_s: float | None = None
    engine_prefill_s: float | None = None
    engine_decode_s: float | None = None

    @property
    def render_s(self) -> float | None:
        """Submission to features ready: the renderer's queue and its feature extraction."""
        return None if self.rendered is None else self.rendered - self.submitted

    def summary(self) -> str:
        """One log phrase: where the pass's time went (parts not measured are left out)."""
        parts = [
            ("features", self.render_s),
            ("first token", self.time_to_first_token_s),
            ("engine queue", self.engine_queue_s),
            ("prefill", self.engine_prefill_s),
            ("decode", self.engine_decode_s),
        ]
        return ", ".join(f"{name} {value:.2f} s" for name, value in parts if value is not None)

    @property
    def time_to_first_token_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.submitted

    @property
    def decode_time_s(self) -> float | None:
        if self.first_token is None or self.finished is None:
            return None
        return self.finished - self.first_token


@dataclass
class GenerationUpdate:
    """A step of a generation: the new text and tokens since the previous update.

    The last update of a stream has `finished=True` and carries the finish and
    stop reasons; the adapter also fills `all_token_ids`, the full sequence.
    """

    text_delta: str
    token_ids_delta: list[int]
    num_generated: int
    prompt_token_count: int
    finished: bool = False
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    all_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    timings: EngineTimings | None = None
    #: Per new token: log-probabilities by token ID (the sampled one and the top-k asked for).
    logprobs: list[dict[int, float]] | None = None
    #: On the last update, when log-probabilities were asked for: those of every generated token.
    all_logprobs: list[dict[int, float]] | None = None
    #: The expanded prompt the engine ran (final update only, where the engine reports it):
    #: qualification compares it with the reference's.
    prompt_token_ids: list[int] | None = None


class EngineDeadError(RuntimeError):
    """The engine cannot serve anymore (its process died or it raised)."""


class EngineInfo(Protocol):
    """Facts about a started engine that budgets, stop evidence and the gate read."""

    sample_rate: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    #: Decoder KV-cache bytes per token in BF16 (budgets report the memory a request holds).
    kv_bytes_per_token_bf16: int
    load_time_s: float | None
    #: The checkpoint directory the engine serves (hashed into the backend identity).
    model_dir: Path
    #: vLLM data-parallel engine copies behind this one front end (1: no data parallelism).
    data_parallel_size: int


class TranscriptionEngine(EngineInfo, Protocol):
    """What the gateway needs from an engine."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationUpdate]:
        """Stream updates; closing the iterator early aborts the request."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def check_health(self) -> None:
        """Raise EngineDeadError when the engine cannot serve."""
        ...

    def count_prompt_tokens(self, num_samples: int, instruction: str) -> int:
        """Exact prompt length for audio of `num_samples` with this instruction."""
        ...

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str: ...

    def token_text(self, token_id: int) -> str: ...

    def token_bytes(self, token_ids: Sequence[int]) -> list[bytes]:
        """The bytes each generated token adds to the text (b"" for special tokens)."""
        ...

    async def attention_backends(self) -> list[str]:
        """The attention backends the engine's workers selected (part of the backend identity)."""
        ...

    async def rank_devices(self) -> list[dict[str, Any]]:
        """Per data-parallel rank, in rank order: `{"rank": r, "devices": [...]}` as its workers report them.

        Part of the backend identity: which GPUs (index, name, UUID) serve, not only how many.
        """
        ...

    def num_running_requests(self) -> int: ...

    def describe(self) -> dict[str, Any]:
        """Everything about the engine that can change its output (for the backend identity)."""
        ...

    async def shutdown(self) -> None: ...
