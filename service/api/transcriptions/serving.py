"""The HTTP face of the transcription pipeline: a form in, a response or an event stream out.

Built once at start-up (`build_serving`). The request takes its admission slot
before its body is read, so uploads waiting for the engine cannot pile up in
memory or on disk; a client that goes away cancels its request
(`with_cancellation`); a stream keeps quiet connections alive with SSE comments.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from service.api.admin import require_admin
from service.api.transcriptions.protocol import (
    parse_form,
    upload_field,
    wants_admin,
)
from service.api.transcriptions.renderers import (
    EVIDENCE_FORMATS,
    MEDIA_TYPES,
    evidence_headers,
    render_body,
    render_event,
    stream_headers,
)
from service.errors import ErrorCode, GatewayError
from service.forms import TRANSCRIPTION_FORM
from service.longform import ChunkingPolicy
from service.state import GatewayState
from service.transcription.job import DoneEvent, Outcome, TranscriptionJob
from service.transcription.params import TranscriptionParams
from service.transcription.pipeline import TranscriptionPipeline

T = TypeVar("T")

#: The status a request gets in the ledger when its client went away (nginx's convention).
CLIENT_CLOSED = 499


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


async def with_cancellation(request: Request, work: Awaitable[T]) -> T:
    """Run `work`, cancelling it as soon as the client disconnects (call once the body is read)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise ClientDisconnected
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        continue


class TranscriptionServing:
    def __init__(self, *, state: GatewayState, pipeline: TranscriptionPipeline) -> None:
        self.state = state
        self.pipeline = pipeline
        self.limits = state.settings.limits
        self.chunking_defaults = ChunkingPolicy(**state.settings.chunking_defaults())

    async def create(self, request: Request) -> Response:
        """POST /v1/audio/transcriptions."""
        state = self.state
        state.require_engine()
        state.require_qualified()
        await state.admission.acquire()
        release: Callable[[], None] | None = state.admission.release
        try:
            async with TRANSCRIPTION_FORM.form(request) as form:
                if wants_admin(form):
                    require_admin(request)
                params = parse_form(
                    form, chunking_defaults=self.chunking_defaults, evidence_by_default=state.settings.evidence.capture_all
                )
                upload = upload_field(form)
                self._check_model(params)
                # Decoded from the spooled upload itself: no second copy of the file in memory.
                job = await self.pipeline.prepare(params, upload.file, upload.filename)
            if params.stream:
                stream = self._stream(job, on_close=state.admission.release)
                release = None  # the stream frees the slot when it ends
                return stream
            try:
                outcome = await with_cancellation(request, self.pipeline.run(job))
            except ClientDisconnected:
                return Response(status_code=CLIENT_CLOSED)
            return self._respond(outcome)
        finally:
            if release is not None:
                release()

    def _check_model(self, params: TranscriptionParams) -> None:
        model, state = params.model, self.state
        if model is None or model.strip() == "":
            return
        if model not in {state.model_name, state.settings.engine.model or state.model_name}:
            raise GatewayError(
                ErrorCode.MODEL_NOT_FOUND,
                f"The model '{model}' is not served here; GET /v1/models lists '{state.model_name}'.",
                param="model",
            )

    def _respond(self, outcome: Outcome) -> Response:
        backend = self.state.gate.tag()
        # json, text and the subtitle formats carry no `moss` object: build it only for those that do
        wants_evidence = outcome.job.params.response_format in EVIDENCE_FORMATS
        evidence = self.pipeline.accountant.evidence(outcome, backend) if wants_evidence else {}
        body = render_body(outcome, backend, evidence)
        headers = evidence_headers(outcome, backend)
        if isinstance(body, str):
            media = MEDIA_TYPES.get(outcome.job.params.response_format, "text/plain")
            return PlainTextResponse(body, headers=headers, media_type=f"{media}; charset=utf-8")
        return JSONResponse(body, headers=headers)

    def _stream(self, job: TranscriptionJob, *, on_close: Callable[[], None]) -> Response:
        backend = self.state.gate.tag()
        headers = {**stream_headers(job.request_id, job.track, backend), "Cache-Control": "no-cache"}
        response: Response = EventSourceResponse(
            self._events(job, on_close),
            ping=self.limits.sse_keepalive_s,
            send_timeout=self.limits.sse_send_timeout_s,
            sep="\n",
            headers=headers,
        )
        return response

    async def _events(self, job: TranscriptionJob, on_close: Callable[[], None]) -> AsyncIterator[ServerSentEvent]:
        """OpenAI's stream events; an error after the 200 becomes the stream's last event."""
        backend = self.state.gate.tag()
        try:
            async for event in self.pipeline.events(job):
                evidence = self.pipeline.accountant.evidence(event.outcome, backend) if isinstance(event, DoneEvent) else None
                yield _sse(render_event(event, backend, evidence))
        except GatewayError as error:
            yield _sse(error.sse_event())
        finally:
            on_close()


def _sse(event: dict[str, object]) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(event, ensure_ascii=False))


def build_serving(state: GatewayState, pipeline: TranscriptionPipeline) -> TranscriptionServing:
    return TranscriptionServing(state=state, pipeline=pipeline)
