"""POST /v1/audio/transcriptions: gathers the form, hands it to the service."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import Response

from service.api.admin import require_admin
from service.api.transcriptions.protocol import (
    TranscriptionParams,
    check_instruction,
    parse_bool,
    parse_budget,
    parse_chunking_strategy,
    parse_granularities,
    parse_response_format,
    parse_temperature,
)
from service.api.transcriptions.serving import TranscriptionService
from service.errors import ErrorCode, GatewayError, documented_errors
from service.longform import ChunkingPolicy
from service.prompt import parse_hotwords
from service.state import GatewayState

router = APIRouter()

OptionalForm = Annotated[str | None, Form()]


def _check_model(state: GatewayState, model: str | None) -> None:
    if model is None or model.strip() == "":
        return
    accepted = {state.model_name, state.settings.engine.model or state.model_name}
    if model not in accepted:
        raise GatewayError(
            ErrorCode.MODEL_NOT_FOUND,
            f"The model '{model}' is not served here; GET /v1/models lists '{state.model_name}'.",
            param="model",
        )


@router.post(
    "/v1/audio/transcriptions",
    response_model=None,
    responses=documented_errors(*(code for code in ErrorCode if code is not ErrorCode.QUALIFICATION_FAILED)),
)
async def create_transcription(
    request: Request,
    file: Annotated[UploadFile | None, File(description="The audio file.")] = None,
    model: OptionalForm = None,
    prompt: Annotated[str | None, Form(description="A custom instruction replacing the default one.")] = None,
    hotwords: Annotated[str | None, Form(description="Comma-separated hotwords, appended to the instruction.")] = None,
    language: Annotated[str | None, Form(description="Recorded only: the model has no language token.")] = None,
    response_format: OptionalForm = None,
    temperature: OptionalForm = None,
    timestamp_granularities: Annotated[list[str] | None, Form(alias="timestamp_granularities[]")] = None,
    stream: OptionalForm = None,
    max_completion_tokens: OptionalForm = None,
    max_new_tokens: Annotated[str | None, Form(description="Alias of max_completion_tokens.")] = None,
    ignore_eos: Annotated[str | None, Form(description="Admin only: generate the whole budget.")] = None,
    capture_evidence: Annotated[str | None, Form(description="Admin only: keep the full evidence bundle.")] = None,
) -> Response:
    state: GatewayState = request.app.state.gateway
    if file is None or isinstance(file, str):
        raise GatewayError(
            ErrorCode.MISSING_FILE,
            "No audio file was uploaded: send it as the multipart form field 'file'.",
            param="file",
        )
    form = await request.form()
    if len(form.getlist("file")) > 1:
        raise GatewayError(ErrorCode.INVALID_REQUEST, "Send exactly one 'file' part; this request has several.", param="file")
    fmt = parse_response_format(response_format)
    wants_stream = parse_bool(stream, param="stream")
    if wants_stream and not fmt.can_stream:
        raise GatewayError(
            ErrorCode.STREAM_NOT_SUPPORTED,
            f"response_format '{fmt.value}' cannot be streamed; use json, text, verbose_json or diarized_json "
            f"with stream=true, or stream=false for {fmt.value}.",
            param="stream",
        )
    budget, budget_field = parse_budget(max_completion_tokens, max_new_tokens)
    chunking = parse_chunking_strategy(form, ChunkingPolicy(**state.settings.chunking_defaults()))
    words = parse_hotwords(hotwords)
    check_instruction(prompt, words)
    force_budget = parse_bool(ignore_eos, param="ignore_eos")
    keep_evidence = parse_bool(capture_evidence, param="capture_evidence")
    if force_budget or keep_evidence:
        require_admin(request)
    params = TranscriptionParams(
        model=model,
        instruction_override=prompt,
        hotwords=tuple(words),
        language=language,
        response_format=fmt,
        temperature=parse_temperature(temperature),
        timestamp_granularities=parse_granularities(timestamp_granularities or []),
        stream=wants_stream,
        max_completion_tokens=budget,
        budget_field=budget_field,
        ignore_eos=force_budget,
        capture_evidence=keep_evidence or state.settings.evidence.capture_all,
        chunking=chunking,
    )
    _check_model(state, model)
    state.require_engine()
    state.require_qualified()
    service = TranscriptionService(state)
    # The slot is taken before the upload is read into memory: memory stays bounded under load.
    await state.admission.acquire()
    handed_to_stream = False
    try:
        data = await file.read()
        job = await service.prepare(params, data, file.filename)
        del data
        if params.stream:
            handed_to_stream = True
            return service.stream_response(job, on_close=state.admission.release)
        try:
            async with asyncio.timeout(state.settings.limits.request_timeout_s):
                outcome = await service.run(job, request.is_disconnected)
        except TimeoutError:
            raise service.timeout_error() from None
        return service.respond(outcome)
    finally:
        if not handed_to_stream:
            state.admission.release()
