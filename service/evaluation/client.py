"""One transcription request per item and track, over HTTP only.

The evaluator sees the gateway exactly as a user does: `POST
/v1/audio/transcriptions` with `response_format=diarized_json`. The native track
sends no `chunking_strategy`; the chunked track sends the `server_vad` object,
which forces chunking (`auto` would let the server decide, and then a short item
could come back native). The server's own `X-Moss-Track` must equal the track
asked for: a mismatch raises, because a number scored under the wrong track is
worse than no number. The backend fingerprint and qualification id are read from
the headers, which every response carries, so each result names the backend that
made it even if the body's layout moves.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from service.evaluation.errors import EvaluationError
from service.evaluation.gold import Turn

CHUNKED_STRATEGY = json.dumps({"type": "server_vad"})


@dataclass(frozen=True)
class Transcription:
    """What the gateway answered for one request, reduced to what scoring needs."""

    track: str
    status: int
    wall_s: float
    segments: tuple[Turn, ...] = ()
    text: str = ""
    duration_s: float | None = None
    stop: str | None = None
    truncated: bool | None = None
    server_coverage: float | None = None
    fingerprint: str = ""
    qualification_id: str = ""
    request_id: str = ""
    cut_plan_sha256: str = ""
    error: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == 200


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def _segments(body: dict[str, Any], name: str) -> tuple[Turn, ...]:
    """The diarized_json segments as turns; a segment without a start or end is a protocol fault."""
    turns = []
    for index, segment in enumerate(body.get("segments") or []):
        try:
            start, end = float(segment["start"]), float(segment["end"])
        except (KeyError, TypeError, ValueError):
            raise EvaluationError(f"{name}: segment {index} of the response has no numeric start and end") from None
        turns.append(Turn(start, end, str(segment.get("speaker") or "?"), str(segment.get("text") or "")))
    return tuple(turns)


class GatewayClient:
    """A thin httpx client for one gateway; `api_key` goes in `Authorization: Bearer`."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 3600.0,
                 max_completion_tokens: int | None = None, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url
        self.max_completion_tokens = max_completion_tokens
        self._client = httpx.Client(base_url=url, headers=headers, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def backend(self) -> dict[str, Any]:
        """`GET /v1/backend`, recorded in the report's header (empty when not reachable)."""
        try:
            response = self._client.get("/v1/backend")
            return response.json() if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def transcribe(self, name: str, audio: bytes, track: str) -> Transcription:
        data: dict[str, str] = {"response_format": "diarized_json"}
        if track == "chunked":
            data["chunking_strategy"] = CHUNKED_STRATEGY
        elif track != "native":
            raise EvaluationError(f"unknown track {track!r}")
        if self.max_completion_tokens is not None:
            data["max_completion_tokens"] = str(self.max_completion_tokens)
        began = time.perf_counter()
        try:
            response = self._client.post("/v1/audio/transcriptions", data=data,
                                         files={"file": (name, audio, "application/octet-stream")})
        except httpx.HTTPError as exc:
            raise EvaluationError(f"{self.url}: request for {name} failed: {exc}") from None
        wall = time.perf_counter() - began
        headers = response.headers
        common = {
            "status": response.status_code,
            "wall_s": round(wall, 4),
            "fingerprint": headers.get("x-moss-backend-fingerprint", ""),
            "qualification_id": headers.get("x-moss-qualification-id", ""),
            "request_id": headers.get("x-request-id", ""),
        }
        if response.status_code != 200:
            try:
                error = response.json().get("error") or {}
            except ValueError:
                error = {"message": response.text[:500]}
            return Transcription(track=track, error={"code": error.get("code"), "message": error.get("message")}, **common)
        served = headers.get("x-moss-track", "")
        if served != track:
            raise EvaluationError(f"{name}: asked for the {track} track, the gateway answered {served or 'no'} track")
        body = response.json()
        truncated = headers.get("x-moss-truncated")
        return Transcription(
            track=track,
            segments=_segments(body, name),
            text=str(body.get("text") or ""),
            duration_s=_float(str(body.get("duration"))) if body.get("duration") is not None else None,
            stop=headers.get("x-moss-stop") or None,
            truncated=None if truncated is None else truncated == "true",
            server_coverage=_float(headers.get("x-moss-coverage")),
            cut_plan_sha256=headers.get("x-moss-cut-plan-sha256", ""),
            **common,
        )
