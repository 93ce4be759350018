"""Wire models of the transcription endpoint (OpenAI's shapes plus our evidence)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

from service.errors import ErrorCode, GatewayError
from service.longform import ChunkingPolicy, from_request

#: Upper bound on any output budget a client may ask for (the engine context caps it further).
ABSURD_BUDGET = 1_000_000
#: Longest custom instruction and hotword list accepted (the prompt must stay small next to the audio).
MAX_INSTRUCTION_CHARS = 4000
MAX_HOTWORDS = 200


class ResponseFormat(str, enum.Enum):
    JSON = "json"
    TEXT = "text"
    VERBOSE_JSON = "verbose_json"
    SRT = "srt"
    VTT = "vtt"
    DIARIZED_JSON = "diarized_json"

    @property
    def can_stream(self) -> bool:
        """Server-sent events carry JSON events; subtitle files only make sense whole."""
        return self in (ResponseFormat.JSON, ResponseFormat.TEXT, ResponseFormat.DIARIZED_JSON, ResponseFormat.VERBOSE_JSON)


@dataclass(frozen=True)
class TranscriptionParams:
    """Validated form fields of one request."""

    model: str | None
    instruction_override: str | None
    hotwords: tuple[str, ...]
    language: str | None
    response_format: ResponseFormat
    temperature: float
    timestamp_granularities: tuple[str, ...]
    stream: bool
    max_completion_tokens: int | None
    budget_field: str = "max_completion_tokens"
    ignore_eos: bool = False  # admin-only: forces the full budget (benchmarks, tests)
    capture_evidence: bool = False  # admin-only: keep the full evidence bundle of this request
    chunking: ChunkingPolicy | None = None  # the chunked track when set; the native track otherwise
    extra: dict[str, Any] = field(default_factory=dict)


def parse_response_format(raw: str | None) -> ResponseFormat:
    value = (raw or "json").strip().lower()
    try:
        return ResponseFormat(value)
    except ValueError:
        allowed = ", ".join(item.value for item in ResponseFormat)
        raise GatewayError(
            ErrorCode.INVALID_RESPONSE_FORMAT,
            f"Unknown response_format '{raw}'. Supported: {allowed}.",
            param="response_format",
        ) from None


def parse_budget(max_completion_tokens: str | None, max_new_tokens: str | None) -> tuple[int | None, str]:
    """The output budget from `max_completion_tokens` or its alias `max_new_tokens`.

    Never ignored silently: both given and different is an error, and a value
    that is not a positive integer below an absurd bound is refused.
    """
    given = {
        name: value
        for name, value in (("max_completion_tokens", max_completion_tokens), ("max_new_tokens", max_new_tokens))
        if value is not None and str(value).strip() != ""
    }
    if not given:
        return None, "max_completion_tokens"
    parsed: dict[str, int] = {}
    for name, value in given.items():
        text = str(value).strip()
        try:
            if not re.fullmatch(r"[+-]?[0-9]+", text):  # int() would also take "1_0" and other scripts' digits
                raise ValueError(text)
            number = int(text)
        except ValueError:
            raise GatewayError(
                ErrorCode.INVALID_BUDGET, f"{name} must be an integer, got '{value}'.", param=name
            ) from None
        if number < 1 or number > ABSURD_BUDGET:
            raise GatewayError(
                ErrorCode.INVALID_BUDGET,
                f"{name}={number} is out of range: it must be between 1 and {ABSURD_BUDGET}.",
                param=name,
            )
        parsed[name] = number
    if len(set(parsed.values())) > 1:
        raise GatewayError(
            ErrorCode.INVALID_BUDGET,
            f"max_completion_tokens={parsed['max_completion_tokens']} and its alias "
            f"max_new_tokens={parsed['max_new_tokens']} disagree; send one.",
            param="max_new_tokens",
        )
    name = next(iter(parsed))
    return parsed[name], name


def parse_temperature(raw: str | None) -> float:
    if raw is None or str(raw).strip() == "":
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise GatewayError(ErrorCode.INVALID_REQUEST, f"temperature must be a number, got '{raw}'.", param="temperature") from None
    if not 0.0 <= value <= 2.0:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST, f"temperature={value:g} is out of range [0, 2].", param="temperature"
        )
    return value


def parse_bool(raw: str | None, *, param: str) -> bool:
    if raw is None or str(raw).strip() == "":
        return False
    value = str(raw).strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise GatewayError(ErrorCode.INVALID_REQUEST, f"{param} must be true or false, got '{raw}'.", param=param)


def parse_granularities(raw: list[str]) -> tuple[str, ...]:
    allowed = {"segment", "word"}
    values = tuple(item.strip() for item in raw if item.strip())
    unknown = [item for item in values if item not in allowed]
    if unknown:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"timestamp_granularities: unknown value(s) {unknown}; supported: segment, word.",
            param="timestamp_granularities[]",
        )
    if "word" in values:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            "timestamp_granularities=word is not supported: MOSS-Transcribe-Diarize writes segment timestamps only.",
            param="timestamp_granularities[]",
        )
    return values


def parse_chunking_strategy(form: Any, defaults: ChunkingPolicy) -> ChunkingPolicy | None:
    """OpenAI's `chunking_strategy`: "auto", a JSON object, or the SDK's `chunking_strategy[key]` fields."""
    raw: Any = form.get("chunking_strategy")
    nested = {
        key[len("chunking_strategy[") : -1]: value
        for key, value in form.multi_items()
        if key.startswith("chunking_strategy[") and key.endswith("]")
    }
    if nested:
        raw = {key: _number(value) for key, value in nested.items()}
    if isinstance(raw, str) and raw.strip() == "":
        raw = None
    try:
        return from_request(raw, defaults=defaults)
    except ValueError as exc:
        raise GatewayError(ErrorCode.INVALID_REQUEST, f"Invalid chunking_strategy: {exc}", param="chunking_strategy") from None


def _number(value: Any) -> Any:
    """Form fields arrive as text; numbers in a server_vad object must be numbers."""
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return value


def check_instruction(prompt: str | None, hotwords: list[str]) -> None:
    if prompt is not None and len(prompt) > MAX_INSTRUCTION_CHARS:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"prompt is {len(prompt)} characters; the longest accepted instruction is {MAX_INSTRUCTION_CHARS}.",
            param="prompt",
        )
    if len(hotwords) > MAX_HOTWORDS or sum(len(word) for word in hotwords) > MAX_INSTRUCTION_CHARS:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"hotwords: at most {MAX_HOTWORDS} words and {MAX_INSTRUCTION_CHARS} characters are accepted.",
            param="hotwords",
        )
