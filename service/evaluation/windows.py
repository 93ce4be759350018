"""Gold windows: fixed cut points through a long program, and what each window holds.

The published protocol scores long programs in 10-minute windows. The cut points
are frozen before anything is transcribed: taken from the manifest (`cuts`) or,
failing that, every `window_s` seconds from 0 to the end of the audio; either way
the list and its SHA-256 go into the report, so two reports can be checked to have
cut the same program in the same places.

A gold turn that crosses a cut keeps its time on both sides (diarization is scored
per frame, so each side gets its part), but its words go only to the window that
holds the turn's midpoint: words cannot be split by time without a word
alignment, and this way every gold word is scored exactly once. The number of
such crossing turns is reported per window; choose cuts in pauses to keep it 0.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import soundfile as sf

from service.evaluation.gold import Turn


@dataclass(frozen=True)
class Window:
    index: int
    start: float
    end: float

    @property
    def label(self) -> str:
        return f"{self.start:g}-{self.end:g}s"


def cut_points(duration_s: float, window_s: float, frozen: Sequence[float] | None = None) -> list[float]:
    """The window boundaries: the frozen list as given, else 0, w, 2w, ... and the end of the audio."""
    if frozen is not None:
        return [float(c) for c in frozen]
    points = []
    position = 0.0
    while position < duration_s - 1e-9:
        points.append(round(position, 6))
        position += window_s
    points.append(round(duration_s, 6))
    return points


def cuts_sha256(points: Sequence[float]) -> str:
    return hashlib.sha256(json.dumps([round(float(p), 6) for p in points]).encode()).hexdigest()


def windows(points: Sequence[float]) -> list[Window]:
    return [Window(i, a, b) for i, (a, b) in enumerate(zip(points, points[1:], strict=False))]


def gold_in_window(turns: Sequence[Turn], window: Window) -> tuple[list[Turn], int]:
    """The window's gold, on the window's own clock, and how many turns cross its edges."""
    inside: list[Turn] = []
    crossing = 0
    for turn in turns:
        if turn.end <= window.start or turn.start >= window.end:
            continue
        if turn.start < window.start or turn.end > window.end:
            crossing += 1
        middle = (turn.start + turn.end) / 2
        text = turn.text if window.start <= middle < window.end else ""
        start, end = max(turn.start, window.start), min(turn.end, window.end)
        inside.append(Turn(start - window.start, end - window.start, turn.speaker, text))
    return inside, crossing


def audio_duration(path: Path) -> float | None:
    """Seconds of audio as libsndfile reads it; None for containers it cannot open (m4a, mp4, ...)."""
    try:
        return float(sf.info(str(path)).duration)
    except (RuntimeError, sf.LibsndfileError):
        return None


def window_audio(path: Path, window: Window) -> bytes:
    """The window's samples as a 16-bit WAV (read by libsndfile, so WAV/FLAC/OGG programs)."""
    info = sf.info(str(path))
    first = int(round(window.start * info.samplerate))
    last = min(info.frames, int(round(window.end * info.samplerate)))
    samples, rate = sf.read(str(path), start=first, stop=last, dtype="float32", always_2d=False)
    out = io.BytesIO()
    sf.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()
