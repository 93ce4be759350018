"""The transcription endpoint's form: every field parsed and bounded into `TranscriptionParams`.

The form is read by the route itself (after the request holds its admission
slot), so every field is checked here, with the error table's messages, and
the pipeline only ever sees validated parameters.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.datastructures import FormData, UploadFile

from service.errors import ErrorCode, GatewayError
from service.longform import ChunkingPolicy, from_request
from service.prompt import parse_hotwords
from service.transcription.params import ResponseFormat, TrackChoice, TranscriptionParams

#: Upper bound on any output budget a client may ask for (the engine context caps it further).
ABSURD_BUDGET = 1_000_000
#: Longest custom instruction and hotword list accepted (the prompt must stay small next to the audio).
MAX_INSTRUCTION_CHARS = 4000
MAX_HOTWORDS = 200


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


def parse_chunking_strategy(form: FormData, defaults: ChunkingPolicy) -> TrackChoice:
    """OpenAI's `chunking_strategy`: unset (native), "auto" (the server decides), or a server_vad object (chunks).

    The object comes as JSON text or as the SDK's `chunking_strategy[key]` fields.
    """
    raw: Any = form.get("chunking_strategy")
    nested = {
        key[len("chunking_strategy[") : -1]: value
        for key, value in form.multi_items()
        if key.startswith("chunking_strategy[") and key.endswith("]")
    }
    if nested:
        raw = {key: _number(value) for key, value in nested.items()}
    if raw is None or isinstance(raw, str) and raw.strip() == "":
        return TrackChoice("native", defaults)
    if isinstance(raw, str) and raw.strip() == "auto":
        return TrackChoice("auto", defaults)
    try:
        policy = from_request(raw, defaults=defaults)
    except ValueError as exc:
        raise GatewayError(ErrorCode.INVALID_REQUEST, f"Invalid chunking_strategy: {exc}", param="chunking_strategy") from None
    assert policy is not None  # from_request maps only an absent strategy to None
    return TrackChoice("chunked", policy)


def parse_tail_recovery(raw: str | None) -> bool:
    """`tail_recovery`: `auto` (recover a tail the native pass left with speech in it) or `off` (the default)."""
    value = (raw or "off").strip().lower()
    if value in ("off", "none", ""):
        return False
    if value == "auto":
        return True
    raise GatewayError(
        ErrorCode.INVALID_REQUEST, f"tail_recovery must be 'auto' or 'off', got '{raw}'.", param="tail_recovery"
    )


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


INCLUDABLE = ("logprobs",)


def text_field(form: FormData, name: str) -> str | None:
    """A text field, or None; a file sent where text belongs is refused."""
    value = form.get(name)
    if value is None or isinstance(value, str):
        return value
    raise GatewayError(ErrorCode.INVALID_REQUEST, f"'{name}' must be a text field, not a file.", param=name)


def list_field(form: FormData, name: str) -> list[str]:
    """OpenAI's array fields arrive as `name[]` (the SDK) or repeated `name`."""
    values = form.getlist(f"{name}[]") + form.getlist(name)
    if any(not isinstance(value, str) for value in values):
        raise GatewayError(ErrorCode.INVALID_REQUEST, f"'{name}[]' must be text fields.", param=f"{name}[]")
    return [str(value).strip() for value in values if str(value).strip()]


def upload_field(form: FormData) -> UploadFile:
    files = [value for value in form.getlist("file") if isinstance(value, UploadFile)]
    if not files:
        raise GatewayError(
            ErrorCode.MISSING_FILE, "No audio file was uploaded: send it as the multipart form field 'file'.", param="file"
        )
    if len(form.getlist("file")) > 1:
        raise GatewayError(ErrorCode.INVALID_REQUEST, "Send exactly one 'file' part; this request has several.", param="file")
    return files[0]


def parse_include(values: list[str]) -> bool:
    """`include[]`: only `logprobs` exists for transcriptions; returns whether it was asked for."""
    unknown = [value for value in values if value not in INCLUDABLE]
    if unknown:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST, f"include[]: unknown value(s) {unknown}; supported: logprobs.", param="include[]"
        )
    return "logprobs" in values


def refuse_known_speakers(form: FormData) -> None:
    """OpenAI's speaker references steer a model that embeds voices; MOSS cannot use them, so say so."""
    for name in ("known_speaker_names", "known_speaker_references"):
        if form.getlist(f"{name}[]") or form.getlist(name):
            raise GatewayError(
                ErrorCode.UNSUPPORTED_PARAMETER,
                f"{name}[] is not supported: MOSS-Transcribe-Diarize labels speakers S01, S02... by itself and "
                f"cannot be given reference voices or names. Rename speakers in the response instead.",
                param=f"{name}[]",
            )


def parse_form(form: FormData, *, chunking_defaults: ChunkingPolicy, evidence_by_default: bool) -> TranscriptionParams:
    """Every field of the form, validated; admin-only fields are checked by the caller (`admin_fields`)."""
    refuse_known_speakers(form)
    fmt = parse_response_format(text_field(form, "response_format"))
    stream = parse_bool(text_field(form, "stream"), param="stream")
    if stream and not fmt.can_stream:
        raise GatewayError(
            ErrorCode.STREAM_NOT_SUPPORTED,
            f"response_format '{fmt.value}' cannot be streamed; use json, text, verbose_json or diarized_json "
            f"with stream=true, or stream=false for {fmt.value}.",
            param="stream",
        )
    budget, budget_field = parse_budget(text_field(form, "max_completion_tokens"), text_field(form, "max_new_tokens"))
    prompt = text_field(form, "prompt")
    words = parse_hotwords(text_field(form, "hotwords")) + list_field(form, "keywords")
    check_instruction(prompt, words)
    language = text_field(form, "language")
    return TranscriptionParams(
        model=text_field(form, "model"),
        instruction_override=prompt,
        hotwords=tuple(dict.fromkeys(words)),
        language=language,
        languages=tuple(list_field(form, "languages")),
        response_format=fmt,
        temperature=parse_temperature(text_field(form, "temperature")),
        timestamp_granularities=parse_granularities(list_field(form, "timestamp_granularities")),
        stream=stream,
        max_completion_tokens=budget,
        budget_field=budget_field,
        include_logprobs=parse_include(list_field(form, "include")),
        track=parse_chunking_strategy(form, chunking_defaults),
        tail_recovery=parse_tail_recovery(text_field(form, "tail_recovery")),
        ignore_eos=parse_bool(text_field(form, "ignore_eos"), param="ignore_eos"),
        capture_evidence=parse_bool(text_field(form, "capture_evidence"), param="capture_evidence") or evidence_by_default,
    )


def wants_admin(form: FormData) -> bool:
    """Admin-only fields present: `ignore_eos` and `capture_evidence` need the admin token."""
    return parse_bool(text_field(form, "ignore_eos"), param="ignore_eos") or parse_bool(
        text_field(form, "capture_evidence"), param="capture_evidence"
    )
