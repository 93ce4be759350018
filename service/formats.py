"""Render parsed segments as SRT, WebVTT and RTTM, the text response formats.

Why this is its own module: subtitle files are read by strict players, so the
details live in one place: milliseconds rounded half-up once per timestamp (so
an end is never printed before its start), speaker labels kept visible, and
cue text cleaned of what would end a cue early (blank lines, `-->`) or be read
as markup in WebVTT (`<`, `&`). RTTM (NIST speaker turns, read by diarization
scorers such as dscore and pyannote) shares the millisecond rounding, so a turn
printed there starts and ends exactly where the subtitle cue does. The web page
(`service/web/app.js`) renders the same three formats in the browser with the
same rules; the browser test holds the two to agreement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from service.transcript import Segment

_VTT_ESCAPES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"))


def format_timestamp(seconds: float, *, separator: str) -> str:
    """`HH:MM:SS<separator>mmm`; negative or non-finite input prints as zero."""
    return _clock(_millis(seconds), separator)


def render_srt(segments: Sequence[Segment]) -> str:
    """SubRip: numbered cues from 1, `[S01] text`; no segments gives ""."""
    cues = []
    for number, segment in enumerate(segments, start=1):
        start, end = _span(segment)
        text = _cue_text(segment.text).replace("-->", "->")
        line = f"[{segment.speaker}] {text}".rstrip()
        cues.append(f"{number}\n{_clock(start, ',')} --> {_clock(end, ',')}\n{line}\n")
    return "\n".join(cues)


def render_vtt(segments: Sequence[Segment]) -> str:
    """WebVTT: header, then cues with the speaker as a voice span `<v S01>text`."""
    cues = ["WEBVTT\n"]
    for segment in segments:
        start, end = _span(segment)
        voice = _vtt_escape(segment.speaker)
        cues.append(f"{_clock(start, '.')} --> {_clock(end, '.')}\n<v {voice}>{_vtt_escape(_cue_text(segment.text))}\n")
    return "\n".join(cues)


def render_rttm(segments: Sequence[Segment], file_id: str) -> str:
    """NIST RTTM: one `SPEAKER <file> 1 <onset> <duration> <NA> <NA> <speaker> <NA> <NA>` line a turn.

    RTTM fields are separated by whitespace, so whitespace inside the file id or
    a speaker name becomes `_` (an empty one becomes `audio` / `unknown`). Times
    are seconds with three decimals from the same rounded milliseconds as SRT, the
    duration their difference. A turn of zero duration is left out: scorers
    reject or ignore it, and it holds no speech time to score.
    """
    file_token = _rttm_token(file_id, "audio")
    lines = []
    for segment in segments:
        start, end = _span(segment)
        if end == start:
            continue
        speaker = _rttm_token(segment.speaker, "unknown")
        lines.append(f"SPEAKER {file_token} 1 {_seconds(start)} {_seconds(end - start)} <NA> <NA> {speaker} <NA> <NA>\n")
    return "".join(lines)


def _rttm_token(value: str, empty: str) -> str:
    """One RTTM field: runs of whitespace become one `_`."""
    return "_".join(value.split()) or empty


def _seconds(millis: int) -> str:
    return f"{millis // 1000}.{millis % 1000:03d}"


def _span(segment: Segment) -> tuple[int, int]:
    """Start and end in whole milliseconds, the end never before the start."""
    start = _millis(segment.start)
    return start, max(start, _millis(segment.end))


def _millis(seconds: float) -> int:
    """Half-up rounding is monotonic, so ordered times stay ordered once printed."""
    if not math.isfinite(seconds) or seconds <= 0:
        return 0
    return math.floor(seconds * 1000 + 0.5)


def _clock(millis: int, separator: str) -> str:
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, ms = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{ms:03d}"


def _cue_text(text: str) -> str:
    """One cue's text without blank lines, which would end the cue early."""
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def _vtt_escape(text: str) -> str:
    for raw, escaped in _VTT_ESCAPES:
        text = text.replace(raw, escaped)
    return text

