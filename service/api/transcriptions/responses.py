"""Answers in the requested format, with the stop evidence in headers and JSON."""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import JSONResponse, PlainTextResponse, Response

from service.api.transcriptions.jobs import Outcome
from service.api.transcriptions.protocol import ResponseFormat
from service.formats import render_srt, render_vtt
from service.state import GatewayState
from service.transcript import Segment

logger = logging.getLogger(__name__)


class ResponsesMixin:
    """Rendering of `TranscriptionService` (uses `self.state` and `AccountingMixin.evidence`)."""

    state: GatewayState

    def headers(self, outcome: Outcome) -> dict[str, str]:
        gate = self.state.gate
        return {
            "X-Request-Id": outcome.job.request_id,
            "X-Moss-Track": outcome.job.track,
            "X-Moss-Cut-Plan-Sha256": "" if outcome.job.plan is None else outcome.job.plan.sha256,
            "X-Moss-Stop": outcome.stop.stop,
            "X-Moss-Truncated": "true" if outcome.truncated else "false",
            "X-Moss-Generated-Tokens": str(outcome.stop.generated_tokens),
            "X-Moss-Max-Tokens": str(outcome.job.budget.max_tokens),
            "X-Moss-Coverage": f"{outcome.coverage.coverage:.4f}",
            "X-Moss-Uncovered-Tail-S": f"{outcome.coverage.uncovered_tail_s:.3f}",
            "X-Moss-Backend-Fingerprint": gate.fingerprint or "",
            "X-Moss-Qualification-Id": gate.qualification_id or "",
        }

    def usage(self, outcome: Outcome) -> dict[str, Any]:
        prompt = outcome.job.budget.prompt_tokens
        generated = outcome.stop.generated_tokens
        audio_tokens = outcome.job.budget.audio_tokens
        return {
            "type": "tokens",
            "input_tokens": prompt,
            "input_token_details": {"audio_tokens": audio_tokens, "text_tokens": prompt - audio_tokens},
            "output_tokens": generated,
            "total_tokens": prompt + generated,
        }

    def body(self, outcome: Outcome) -> dict[str, Any] | str:
        """The response body in the requested format."""
        fmt = outcome.job.params.response_format
        transcript = outcome.transcript
        segments = transcript.segments
        if fmt is ResponseFormat.TEXT:
            return transcript.text
        if fmt is ResponseFormat.SRT:
            return render_srt(segments)
        if fmt is ResponseFormat.VTT:
            return render_vtt(segments)
        backend = {
            "fingerprint": self.state.gate.fingerprint,
            "qualification_id": self.state.gate.qualification_id,
        }
        if fmt is ResponseFormat.JSON:
            return {"text": transcript.text, "usage": self.usage(outcome), "backend": backend}
        duration = round(outcome.job.audio.duration_s, 3)
        if fmt is ResponseFormat.VERBOSE_JSON:
            return {
                "task": "transcribe",
                "language": outcome.job.params.language or "unknown",
                "duration": duration,
                "text": transcript.text,
                "segments": [_verbose_segment(s, outcome.job.params.temperature) for s in segments],
                "usage": self.usage(outcome),
                "backend": backend,
                "moss": self.evidence(outcome),
            }
        return {
            "task": "transcribe",
            "duration": duration,
            "text": transcript.text,
            "segments": [diarized_segment(s) for s in segments],
            "usage": self.usage(outcome),
            "backend": backend,
            "moss": self.evidence(outcome),
        }

    def respond(self, outcome: Outcome) -> Response:
        body = self.body(outcome)
        headers = self.headers(outcome)
        fmt = outcome.job.params.response_format
        if isinstance(body, str):
            media = {ResponseFormat.SRT: "application/x-subrip", ResponseFormat.VTT: "text/vtt"}.get(fmt, "text/plain")
            return PlainTextResponse(body, headers=headers, media_type=f"{media}; charset=utf-8")
        return JSONResponse(body, headers=headers)

    def done_event(self, outcome: Outcome) -> dict[str, Any]:
        """The stream's last event: OpenAI's `transcript.text.done` with the stop evidence."""
        return {
            "type": "transcript.text.done",
            "text": outcome.transcript.text,
            "usage": self.usage(outcome),
            "backend": {"fingerprint": self.state.gate.fingerprint, "qualification_id": self.state.gate.qualification_id},
            "moss": self.evidence(outcome),
        }


def diarized_segment(segment: Segment) -> dict[str, Any]:
    return {
        "type": "transcript.text.segment",
        "id": f"seg_{segment.id}",
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "speaker": segment.speaker,
    }


def _verbose_segment(segment: Segment, temperature: float) -> dict[str, Any]:
    return {
        "id": segment.id,
        "seek": 0,
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "speaker": segment.speaker,
        "tokens": [],
        "temperature": temperature,
    }
