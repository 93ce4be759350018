"""Stop evidence: why a generation ended and how much of the audio it covers.

Classified from the engine's own outputs (finish reason, stop reason, the last
generated token), never guessed from the text: an operator must be able to tell
a model that chose to stop from a cap that stopped it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from service.transcript import ParsedTranscript

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


@dataclass(frozen=True)
class Coverage:
    audio_duration_s: float
    last_segment_end_s: float | None
    coverage: float
    uncovered_tail_s: float
    ends_inside_tag: bool
    incomplete_tail: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)  # scalar fields only: no recursive deep copy (asdict)


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


def measure_coverage(transcript: ParsedTranscript, duration_s: float) -> Coverage:
    last_end = transcript.last_end
    covered = min(last_end or 0.0, duration_s)
    return Coverage(
        audio_duration_s=round(duration_s, 3),
        last_segment_end_s=last_end,
        coverage=round(covered / duration_s, 4) if duration_s > 0 else 0.0,
        uncovered_tail_s=round(max(0.0, duration_s - covered), 3),
        ends_inside_tag=transcript.ends_inside_tag,
        incomplete_tail=transcript.incomplete_tail,
    )


def truncation_reasons(stop: StopRecord, coverage: Coverage, *, margin_s: float) -> list[str]:
    """Why a response must be flagged truncated; empty when it is not."""
    reasons: list[str] = []
    if stop.stop != "eos":
        reasons.append(f"stopped by {stop.stop}, not an end token")
    if coverage.uncovered_tail_s > margin_s:
        reasons.append(f"{coverage.uncovered_tail_s:.2f} s of audio after the last segment (margin {margin_s:g} s)")
    if coverage.ends_inside_tag:
        reasons.append("text ends inside an unfinished tag")
    return reasons


def evidence_bundle_path(state_dir: Path, request_id: str) -> Path:
    """Where a request's full evidence bundle is kept (written by the accountant, read by the admin route)."""
    return state_dir / "evidence" / f"{request_id}.json"
