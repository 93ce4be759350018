"""POST /v1/audio/transcriptions and /v1/audio/translations: HTTP only, the work is in `serving`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from service.api.transcriptions.serving import TranscriptionServing
from service.errors import ErrorCode, GatewayError, documented_errors
from service.transcription.params import ResponseFormat

router = APIRouter()


def _text(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _array(description: str) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "string"}, "description": description}


#: The form as OpenAPI documents it (the route reads it itself, after taking its admission slot).
FORM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["file"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "The audio file."},
        "model": _text("Optional; must name the served model."),
        "prompt": _text("A custom instruction replacing the default one."),
        "hotwords": _text("Comma-separated hotwords, appended to the instruction."),
        "keywords[]": _array("Hotwords, one per field (OpenAI's name)."),
        "language": _text("Recorded only: the model has no language token."),
        "languages[]": _array("Recorded only, like language."),
        "response_format": {"type": "string", "enum": [f.value for f in ResponseFormat]},
        "temperature": _text("0 (greedy) to 2."),
        "timestamp_granularities[]": _array("segment (word is refused)."),
        "include[]": _array("logprobs: token log-probabilities in json and in the stream."),
        "stream": _text("true: server-sent events."),
        "max_completion_tokens": _text("The output budget."),
        "max_new_tokens": _text("Alias of max_completion_tokens."),
        "chunking_strategy": _text("auto (the server decides) or a server_vad JSON object (chunked track)."),
        "tail_recovery": {
            "type": "string",
            "enum": ["off", "auto"],
            "default": "off",
            "description": (
                "auto: when the native pass stops early with speech left after its last segment, transcribe the "
                "rest in further passes (each from a frozen cut a little before the last settled segment ends), "
                "stitched like chunks. Reported as track native+recovery; the native pass's own stop evidence "
                "stays in moss.stop and moss.recovery.native. Ignored on the chunked track."
            ),
        },
        "known_speaker_names[]": _array("Refused: the model cannot use reference speakers."),
        "known_speaker_references[]": _array("Refused: the model cannot use reference speakers."),
        "ignore_eos": _text("Admin only: generate the whole budget."),
        "capture_evidence": _text("Admin only: keep the full evidence bundle."),
    },
}


def _serving(request: Request) -> TranscriptionServing:
    return request.app.state.transcription  # type: ignore[no-any-return]


@router.post(
    "/v1/audio/transcriptions",
    response_model=None,
    responses=documented_errors(*(code for code in ErrorCode if code is not ErrorCode.QUALIFICATION_FAILED)),
    openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": FORM_SCHEMA}}}},
)
async def create_transcription(request: Request) -> Response:
    return await _serving(request).create(request)


@router.post("/v1/audio/translations", response_model=None, responses=documented_errors(ErrorCode.UNSUPPORTED_TASK))
async def create_translation() -> Response:
    """OpenAI's translation endpoint: MOSS-Transcribe-Diarize transcribes only, so say so (not a bare 404)."""
    raise GatewayError(
        ErrorCode.UNSUPPORTED_TASK,
        "Translation is not supported: MOSS-Transcribe-Diarize transcribes in the spoken language only. "
        "Use POST /v1/audio/transcriptions.",
    )
