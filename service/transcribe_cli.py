"""`moss-gateway transcribe FILE...`: transcribe files through a gateway's HTTP API.

Why through HTTP even with `--standalone`: the command is a client of the public
API, so what it writes is what any client gets, with the same errors, the same
gate and the same stop evidence. `--standalone` starts a gateway from the same
app factory on a free loopback port for the duration of the command.

Every request streams (`stream=true`, `response_format=diarized_json`) so that a
progress bar can follow the segment and progress events; the requested format is
then built from the final event and the final segments: `text`, `json` and
`diarized_json` are the same bodies the API returns, and `srt`, `vtt` and `rttm`
come from the server's own renderers in `service/formats.py`. `verbose_json` has
per-segment fields the stream does not carry, so it is asked for unstreamed (no bar).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx
import soundfile
import uvicorn
from fastapi import FastAPI

from service.app import create_app
from service.formats import render_rttm, render_srt, render_vtt
from service.settings import GatewaySettings
from service.transcript import Segment

#: The file extension of each output format.
EXTENSIONS: dict[str, str] = {
    "text": "txt",
    "json": "json",
    "verbose_json": "json",
    "diarized_json": "json",
    "srt": "srt",
    "vtt": "vtt",
    "rttm": "rttm",
}
#: Formats asked for unstreamed, exactly as the API renders them.
UNSTREAMED = frozenset({"verbose_json"})


class TranscribeError(Exception):
    """A transcription failed; `message` is the API's own words where it sent some."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class GatewayUnreachable(TranscribeError):
    """No gateway answered at the URL: every further file would fail the same way."""


@dataclass
class Result:
    """What one transcription produced: the file's text and its stop evidence."""

    body: str
    segments: int
    truncated: bool
    evidence: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ events --


def sse_events(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON data of each server-sent event; comment lines (`: ping`) are skipped."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                text = "\n".join(data)
                data = []
                if text != "[DONE]":
                    yield json.loads(text)
            continue
        if line.startswith(":"):
            continue
        if line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield json.loads("\n".join(data))


def _segment(event: dict[str, Any], index: int) -> Segment:
    return Segment(
        id=index, start=float(event["start"]), end=float(event["end"]),
        speaker=str(event.get("speaker", "")), text=str(event.get("text", "")),
    )


def render(fmt: str, segment_events: list[dict[str, Any]], done: dict[str, Any], file_id: str) -> str:
    """The requested format's body, from the stream's final segments and its final event."""
    segments = [_segment(event, index) for index, event in enumerate(segment_events)]
    if fmt == "text":
        return str(done.get("text", ""))
    if fmt == "srt":
        return render_srt(segments)
    if fmt == "vtt":
        return render_vtt(segments)
    if fmt == "rttm":
        return render_rttm(segments, file_id)
    if fmt == "json":
        body: dict[str, Any] = {"text": done.get("text", ""), "usage": done.get("usage"), "backend": done.get("backend")}
    else:
        moss = done.get("moss") or {}
        body = {
            "task": "transcribe",
            "duration": (moss.get("audio") or {}).get("duration_s"),
            "text": done.get("text", ""),
            "segments": segment_events,
            "usage": done.get("usage"),
            "backend": done.get("backend"),
            "moss": moss,
        }
    return json.dumps(body, ensure_ascii=False, indent=2) + "\n"


# -------------------------------------------------------------- progress --


class ProgressBar:
    """One line on a terminal, redrawn in place; silent when the stream is not a TTY."""

    def __init__(self, label: str, stream: TextIO) -> None:
        self.label = label
        self.stream = stream
        self.enabled = stream.isatty()
        self.started = time.monotonic()
        self.fraction: float | None = None
        self.detail = "uploading"
        self.drawn = False

    def update(self, *, fraction: float | None = None, detail: str | None = None) -> None:
        if fraction is not None:
            self.fraction = max(0.0, min(1.0, fraction))
        if detail is not None:
            self.detail = detail
        self.draw()

    def line(self, width: int) -> str:
        """The bar's text for a terminal `width` columns wide."""
        elapsed = f"{time.monotonic() - self.started:5.1f}s"
        tail = f" {self.detail} {elapsed}"
        room = max(10, width - len(self.label) - len(tail) - 10)
        if self.fraction is None:
            spin = int((time.monotonic() - self.started) * 4) % room
            bar = "." * spin + "#" + "." * (room - spin - 1)
            share = "  ? %"
        else:
            filled = round(self.fraction * room)
            bar = "#" * filled + "." * (room - filled)
            share = f"{self.fraction * 100:3.0f} %"
        return f"{self.label} [{bar}] {share}{tail}"[: max(1, width - 1)]

    def draw(self) -> None:
        if not self.enabled:
            return
        width = shutil.get_terminal_size((80, 24)).columns
        self.stream.write("\r" + self.line(width).ljust(width - 1))
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.enabled and self.drawn:
            width = shutil.get_terminal_size((80, 24)).columns
            self.stream.write("\r" + " " * (width - 1) + "\r")
            self.stream.flush()


def _progress(event: dict[str, Any]) -> tuple[float | None, str | None]:
    """A fraction of the audio and a short label from one `moss.progress` event."""
    fraction = event.get("fraction")
    covered, duration = event.get("covered_s"), event.get("duration_s")
    if fraction is None and isinstance(covered, int | float) and isinstance(duration, int | float) and duration > 0:
        fraction = covered / duration
    if isinstance(covered, int | float) and isinstance(duration, int | float):
        return fraction, f"{covered:.1f}/{duration:.1f} s"
    if "generated_tokens" in event:
        return fraction, f"{event['generated_tokens']} tokens"
    if "chunks" in event:
        return fraction, f"{event['chunks']} chunks"
    return fraction, None


# --------------------------------------------------------------- requests --


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def local_duration(path: Path) -> float | None:
    """The file's length when libsndfile can read its header (WAV, FLAC, OGG, MP3), for the bar
    until the server's progress events say it; None for other containers (the server decodes those)."""
    try:
        return float(soundfile.info(str(path)).duration)
    except (RuntimeError, OSError):
        return None


def _api_error(response: httpx.Response) -> TranscribeError:
    try:
        error = response.json()["error"]
        return TranscribeError(str(error["message"]), status=response.status_code, code=error.get("code"))
    except (ValueError, KeyError, TypeError):
        text = response.text.strip() or response.reason_phrase
        return TranscribeError(f"HTTP {response.status_code}: {text[:500]}", status=response.status_code)


def _stream_error(event: dict[str, Any]) -> TranscribeError:
    error = event.get("error") or {}
    return TranscribeError(str(error.get("message") or "the stream ended with an error"), code=error.get("code"))


def transcribe_file(
    client: httpx.Client, path: Path, fmt: str, *, fields: dict[str, str], progress: ProgressBar
) -> Result:
    """One file through `POST /v1/audio/transcriptions`; raises `TranscribeError` with the API's message."""
    with path.open("rb") as handle:
        files = {"file": (path.name, handle, "application/octet-stream")}
        if fmt in UNSTREAMED:
            progress.update(detail="transcribing (no progress for this format)")
            response = client.post("/v1/audio/transcriptions", data={**fields, "response_format": fmt}, files=files)
            if response.status_code != 200:
                raise _api_error(response)
            body = response.json()
            return Result(
                body=json.dumps(body, ensure_ascii=False, indent=2) + "\n",
                segments=len(body.get("segments") or []),
                truncated=response.headers.get("x-moss-truncated") == "true",
                evidence=body.get("moss") or {},
            )
        data = {**fields, "response_format": "diarized_json", "stream": "true"}
        with client.stream("POST", "/v1/audio/transcriptions", data=data, files=files) as response:
            if response.status_code != 200:
                response.read()
                raise _api_error(response)
            progress.update(detail="transcribing")
            return _follow(response, fmt, path.stem, progress, duration=local_duration(path))


def _follow(
    response: httpx.Response, fmt: str, file_id: str, progress: ProgressBar, *, duration: float | None
) -> Result:
    segments: list[dict[str, Any]] = []
    for event in sse_events(response.iter_lines()):
        kind = event.get("type")
        if kind == "transcript.text.segment":
            segments.append(event)
            label = _count(len(segments), "segment")
            if duration:
                progress.update(fraction=min(1.0, float(event["end"]) / duration), detail=label)
            else:
                progress.update(detail=label)
        elif kind == "moss.progress":
            fraction, detail = _progress(event)
            if isinstance(event.get("duration_s"), int | float):
                duration = float(event["duration_s"])
            progress.update(fraction=fraction, detail=detail)
        elif kind == "transcript.text.done":
            moss = event.get("moss") or {}
            progress.update(fraction=1.0, detail="done")
            return Result(
                body=render(fmt, segments, event, file_id),
                segments=len(segments),
                truncated=bool(moss.get("truncated")),
                evidence=moss,
            )
        elif kind == "error":
            raise _stream_error(event)
    raise TranscribeError("the stream ended before its final event (transcript.text.done)")


def output_paths(inputs: list[Path], fmt: str, out_dir: Path) -> list[Path]:
    """One output a file, `<stem>.<ext>` in `out_dir`; two inputs may not land on one output or on an input."""
    extension = EXTENSIONS[fmt]
    outputs = [out_dir / f"{path.stem}.{extension}" for path in inputs]
    seen: dict[Path, Path] = {}
    for source, target in zip(inputs, outputs, strict=True):
        resolved = target.resolve()
        if resolved in seen:
            raise TranscribeError(f"{source} and {seen[resolved]} would both be written to {target}")
        if resolved == source.resolve():
            raise TranscribeError(f"{target} would overwrite its own input; choose another -o directory")
        seen[resolved] = source
    return outputs


def truncation_warning(path: Path, evidence: dict[str, Any]) -> str:
    reasons = "; ".join(evidence.get("truncation_reasons") or []) or "see the stop evidence"
    coverage = (evidence.get("coverage") or {}).get("coverage")
    share = f", {coverage * 100:.0f} % of the audio covered" if isinstance(coverage, int | float) else ""
    return f"warning: {path}: the result is truncated ({reasons}{share})"


def run(
    inputs: list[Path],
    *,
    url: str,
    fmt: str,
    out_dir: Path,
    api_key: str | None,
    fields: dict[str, str],
    timeout_s: float,
    stderr: TextIO,
) -> int:
    """Transcribe each input in turn; 0 when all succeeded, 1 when any failed, 2 when no gateway answered."""
    try:
        outputs = output_paths(inputs, fmt, out_dir)
    except TranscribeError as error:
        print(f"moss-gateway transcribe: {error.message}", file=stderr)
        return 2
    missing = [str(path) for path in inputs if not path.is_file()]
    if missing:
        print(f"moss-gateway transcribe: no such file: {', '.join(missing)}", file=stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    failed = 0
    with httpx.Client(base_url=url, headers=headers, timeout=timeout) as client:
        for path, target in zip(inputs, outputs, strict=True):
            progress = ProgressBar(path.name, stderr)
            try:
                try:
                    result = transcribe_file(client, path, fmt, fields=fields, progress=progress)
                except httpx.TransportError as exc:
                    raise GatewayUnreachable(f"no answer from the gateway at {url}: {exc}") from exc
            except TranscribeError as error:
                progress.close()
                print(f"moss-gateway transcribe: {path}: {error.message}", file=stderr)
                if isinstance(error, GatewayUnreachable):
                    return 2
                failed += 1
                continue
            progress.close()
            target.write_text(result.body, encoding="utf-8")
            stop = (result.evidence.get("stop") or {}).get("stop", "?")
            print(f"{path} -> {target} ({_count(result.segments, 'segment')}, stop {stop})", file=stderr)
            if result.truncated:
                print(truncation_warning(path, result.evidence), file=stderr)
    return 1 if failed else 0


# ------------------------------------------------------------- standalone --


class StandaloneGateway:
    """A gateway app (from `create_app`) on a free loopback port, served by uvicorn in a thread."""

    def __init__(self, app: FastAPI) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="standalone-gateway", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, timeout_s: float, stderr: TextIO, api_key: str | None = None) -> None:
        """Until /ready says yes, or the engine is up with the gate decided (the API then says why it refuses)."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        progress = ProgressBar("starting the gateway", stderr)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        while time.monotonic() < deadline:
            if not self.thread.is_alive():
                raise TranscribeError("the standalone gateway stopped during start-up")
            try:
                ready = httpx.get(f"{self.url}/ready", headers=headers, timeout=5)
                backend = httpx.get(f"{self.url}/v1/backend", headers=headers, timeout=5).json()
            except (httpx.TransportError, ValueError):
                ready, backend = None, {}
            if ready is not None and ready.status_code == 200:
                progress.close()
                return
            engine = backend.get("engine_status")
            qualifying = bool((backend.get("qualification") or {}).get("progress"))
            if engine == "failed" or (engine == "ready" and backend.get("fingerprint") and not qualifying):
                progress.close()
                return
            progress.update(detail=f"engine {engine or 'starting'}" + (", qualifying" if qualifying else ""))
            time.sleep(0.5)
        progress.close()
        raise TranscribeError(f"the standalone gateway was not ready after {timeout_s:g} s")

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=120)


# ------------------------------------------------------------------- entry --


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="Audio or video files to transcribe.")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="The gateway (default: %(default)s).")
    parser.add_argument("--api-key", help="Sent as 'Authorization: Bearer <key>'.")
    parser.add_argument(
        "--response-format", "-f", choices=sorted(EXTENSIONS), default="srt", help="Output format (default: %(default)s)."
    )
    parser.add_argument("-o", "--output-dir", default=".", help="Where the outputs go, one <name>.<ext> per input.")
    parser.add_argument("--hotwords", help="Comma-separated hotwords.")
    parser.add_argument("--max-completion-tokens", type=int, help="The output budget (default: the gateway's).")
    parser.add_argument("--timeout", type=float, default=3600.0, help="Seconds to wait for a silent gateway.")
    parser.add_argument(
        "--standalone", action="store_true",
        help="Start a gateway in this process (settings from MOSS_GATEWAY_*) instead of using --url.",
    )


def main(args: argparse.Namespace, *, stderr: TextIO | None = None) -> int:
    """Run `transcribe` from parsed arguments (see `add_arguments`)."""
    err = stderr or sys.stderr
    fields: dict[str, str] = {}
    if args.hotwords:
        fields["hotwords"] = args.hotwords
    if args.max_completion_tokens is not None:
        fields["max_completion_tokens"] = str(args.max_completion_tokens)
    inputs = [Path(name) for name in args.files]

    def transcribe_at(url: str) -> int:
        return run(
            inputs, url=url, fmt=args.response_format, out_dir=Path(args.output_dir), api_key=args.api_key,
            fields=fields, timeout_s=args.timeout, stderr=err,
        )

    if not args.standalone:
        return transcribe_at(args.url)
    gateway = StandaloneGateway(create_app(GatewaySettings()))
    try:
        gateway.start(timeout_s=args.timeout, stderr=err, api_key=args.api_key)
        return transcribe_at(gateway.url)
    except TranscribeError as error:
        print(f"moss-gateway transcribe: {error.message}", file=err)
        return 2
    finally:
        gateway.stop()
