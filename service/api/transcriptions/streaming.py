"""Server-sent events: OpenAI's stream events, progress, and the evidence on the last one."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from service.api.transcriptions.jobs import PROGRESS_EVERY_TOKENS, PreparedJob
from service.api.transcriptions.responses import diarized_segment
from service.engine.protocol import GenerationUpdate
from service.errors import ErrorCode, GatewayError
from service.state import GatewayState
from service.transcript import Segment

logger = logging.getLogger(__name__)


class StreamingMixin:
    """Streaming of `TranscriptionService` (uses its engine updates, accounting and rendering)."""

    state: GatewayState

    def stream_response(self, job: PreparedJob, *, on_close: Callable[[], None] | None = None) -> StreamingResponse:
        headers = {"X-Request-Id": job.request_id, "X-Moss-Track": job.track, "Cache-Control": "no-cache"}
        gate = self.state.gate
        headers["X-Moss-Backend-Fingerprint"] = gate.fingerprint or ""
        headers["X-Moss-Qualification-Id"] = gate.qualification_id or ""
        return StreamingResponse(self._events(job, on_close), media_type="text/event-stream", headers=headers)

    async def _events(self, job: PreparedJob, on_close: Callable[[], None] | None = None) -> AsyncIterator[bytes]:
        """The stream, bounded by the request timeout; `on_close` frees the admission slot."""
        try:
            async with asyncio.timeout(self.state.settings.limits.request_timeout_s):
                async for event in self._stream_events(job):
                    yield event
        except TimeoutError:
            yield _sse({"type": "error", "error": self.timeout_error().body()["error"]})
        finally:
            if on_close is not None:
                on_close()

    def timeout_error(self) -> GatewayError:
        limit = self.state.settings.limits.request_timeout_s
        return GatewayError(
            ErrorCode.REQUEST_TIMEOUT,
            f"The transcription ran longer than {limit:g} s (limits.request_timeout_s) and was aborted.",
        )

    async def _stream_chunked(self, job: PreparedJob) -> AsyncIterator[bytes]:
        """The chunked track streams its stitched segments once every chunk is done (no token deltas)."""
        from service.api.transcriptions.chunked import run_chunked

        assert job.plan is not None
        yield _sse({"type": "moss.progress", "chunks": len(job.plan.cuts), "cut_plan_sha256": job.plan.sha256})
        try:
            outcome = await run_chunked(self, job)
        except GatewayError as error:
            yield _sse({"type": "error", "error": error.body()["error"]})
            return
        except asyncio.CancelledError:
            self.account_abort(job, None)
            raise
        await self.account(outcome, status=200)
        for segment in outcome.transcript.segments:
            yield _sse(diarized_segment(segment))
        yield _sse(self.done_event(outcome))

    async def _stream_events(self, job: PreparedJob) -> AsyncIterator[bytes]:
        """OpenAI's stream events, plus progress and the evidence on the final event."""
        if job.plan is not None:
            async for event in self._stream_chunked(job):
                yield event
            return
        text = ""
        scan_from = 0
        segment_index = 0
        final: GenerationUpdate | None = None
        next_progress = PROGRESS_EVERY_TOKENS
        try:
            async for update in self._updates(job):
                if update.text_delta:
                    text += update.text_delta
                    yield _sse({"type": "transcript.text.delta", "delta": update.text_delta})
                    for match in _STREAM_SEGMENT.finditer(text, scan_from):
                        scan_from = match.end()
                        start, end = float(match["start"]), float(match["end"])
                        segment = Segment(
                            id=segment_index, start=start, end=max(start, end),
                            speaker=match["speaker"], text=match["text"].strip(),
                        )
                        segment_index += 1
                        yield _sse(diarized_segment(segment))
                if update.num_generated >= next_progress and not update.finished:
                    next_progress = (update.num_generated // PROGRESS_EVERY_TOKENS + 1) * PROGRESS_EVERY_TOKENS
                    yield _sse({
                        "type": "moss.progress",
                        "generated_tokens": update.num_generated,
                        "max_tokens": job.budget.max_tokens,
                    })
                if update.finished:
                    final = update
        except GatewayError as error:
            yield _sse({"type": "error", "error": error.body()["error"]})
            return
        except asyncio.CancelledError:
            self.account_abort(job, final)
            raise
        if final is None:
            yield _sse({"type": "error", "error": {"message": "The engine ended without a final output.",
                                                    "type": "server_error", "code": "engine_error", "param": None}})
            return
        outcome = self._conclude(job, final)
        await self.account(outcome, status=200)
        yield _sse(self.done_event(outcome))


#: A complete `[start][Sxx]text[end]` segment, for emitting segment events while streaming.
_STREAM_SEGMENT = re.compile(
    r"\[\s*(?P<start>\d+(?:\.\d+)?)\s*\]\s*\[\s*(?P<speaker>S\d+)\s*\](?P<text>[^\[]*?)\[\s*(?P<end>\d+(?:\.\d+)?)\s*\]"
)


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()
