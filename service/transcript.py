"""Parse MOSS output, `[start][Sxx]text[end]` repeated, into segments.

Why a tolerant state machine rather than one strict regex: real generations
stop anywhere (inside a tag, after a header, mid-sentence), occasionally drop
a timestamp, or write plain text. A strict pattern would lose those words or
raise; here every complete segment is kept, every repair is recorded in
`anomalies`, and whatever does not fit lands in `stray_text` or the incomplete
tail, so the caller can always tell what was cut and no word disappears.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# A complete tag: a timestamp (integer or decimal seconds) or a speaker (S01).
# Bounded digit runs keep every timestamp finite and the regex linear.
_TAG = re.compile(r"\[\s*(?:(?P<time>\d{1,12}(?:\.\d{0,12})?|\.\d{1,12})|[Ss]\s*(?P<spk>\d{1,6}))\s*\]")
# What the text may end with when the generation stopped inside a tag.
_PARTIAL_TAG = re.compile(r"\[\s*(?:\d{1,12}(?:\.\d{0,12})?|\.\d{0,12}|[Ss]\s*\d{0,6})?\s*")
_PARTIAL_MAX = 40

_Kind = Literal["time", "spk", "text", "partial"]


@dataclass(frozen=True)
class Segment:
    """One complete `[start][speaker]text[end]` span; ids count from 0."""

    id: int
    start: float
    end: float
    speaker: str
    text: str


@dataclass(frozen=True)
class ParsedTranscript:
    """Everything the raw output contained, sorted into what can be trusted.

    `incomplete_tail` is the raw text of the unfinished last construct (from
    its first tag to the end, or just a cut-off tag); `tail_text` is its words.
    """

    segments: tuple[Segment, ...]
    incomplete_tail: str
    tail_text: str
    ends_inside_tag: bool
    stray_text: tuple[str, ...]
    anomalies: tuple[str, ...]

    @property
    def last_end(self) -> float | None:
        """End of the last complete segment: how far the transcript provably reaches."""
        return self.segments[-1].end if self.segments else None

    @property
    def text(self) -> str:
        """All transcribed words; plain-text output (no segments) falls back to the stray text."""
        parts = [s.text for s in self.segments] if self.segments else list(self.stray_text)
        if self.tail_text:
            parts.append(self.tail_text)
        return " ".join(parts)

    @property
    def speakers(self) -> tuple[str, ...]:
        """Speaker labels in order of first appearance."""
        return tuple(dict.fromkeys(s.speaker for s in self.segments))


@dataclass(frozen=True)
class _Token:
    kind: _Kind
    raw: str
    pos: int
    time: float = 0.0
    speaker: str = ""


def parse_transcript(raw: str) -> ParsedTranscript:
    """Split raw model output into segments; never raises on any string."""
    parser = _Parser(raw)
    tokens = _tokenize(raw)
    for index, token in enumerate(tokens):
        parser.feed(token, _next_tag(tokens, index))
    return parser.result()


def _tokenize(raw: str) -> list[_Token]:
    tokens: list[_Token] = []
    cursor = 0
    for match in _TAG.finditer(raw):
        if match.start() > cursor:
            tokens.append(_Token("text", raw[cursor : match.start()], cursor))
        if match.group("time") is not None:
            tokens.append(_Token("time", match.group(0), match.start(), time=float(match.group("time"))))
        else:
            tokens.append(_Token("spk", match.group(0), match.start(), speaker="S" + match.group("spk")))
        cursor = match.end()
    rest = raw[cursor:]
    bracket = rest.rfind("[")
    if bracket >= 0 and len(rest) - bracket <= _PARTIAL_MAX and _PARTIAL_TAG.fullmatch(rest, bracket):
        if bracket > 0:
            tokens.append(_Token("text", rest[:bracket], cursor))
        tokens.append(_Token("partial", rest[bracket:], cursor + bracket))
    elif rest:
        tokens.append(_Token("text", rest, cursor))
    return tokens


def _next_tag(tokens: list[_Token], index: int) -> _Kind | None:
    """Kind of the next token that is not whitespace (None at the end)."""
    for ahead in range(index + 1, len(tokens)):  # text tokens never touch, so this looks 2 ahead at most
        token = tokens[ahead]
        if token.kind != "text" or token.raw.strip():
            return token.kind
    return None


class _Parser:
    """Three states: nothing open; a start stamp waiting for its speaker
    (`start` set, `speaker` None); an open segment (`start` and `speaker` set)."""

    def __init__(self, raw: str) -> None:
        self.raw = raw
        self.segments: list[Segment] = []
        self.stray: list[str] = []
        self.anomalies: list[str] = []
        self.start: float | None = None
        self.speaker: str | None = None
        self.body: list[str] = []
        self.start_pos = 0  # where the unfinished construct begins in raw
        self.partial_pos: int | None = None

    def feed(self, token: _Token, next_kind: _Kind | None) -> None:
        if token.kind == "text":
            self._text(token)
        elif token.kind == "spk":
            self._speaker(token)
        elif token.kind == "time":
            self._time(token, next_kind)
        else:
            self.partial_pos = token.pos

    def _text(self, token: _Token) -> None:
        if self.speaker is not None:
            self.body.append(token.raw)
        elif token.raw.strip():
            self.stray.append(token.raw.strip())
            if self.start is not None:
                self.anomalies.append(f"timestamp {_stamp(self.start)} not followed by a speaker tag, ignored")
                self.start = None

    def _speaker(self, token: _Token) -> None:
        if self.speaker is not None and self.start is not None:  # speaker tag inside an open segment
            if self._body():
                boundary = self.start
                self._close(boundary, f"no timestamp before speaker {token.speaker}, end set to start")
                self._open(boundary, token)
            else:
                self.anomalies.append(f"speaker {self.speaker} with no text replaced by {token.speaker}")
                self.speaker = token.speaker
            return
        if self.start is None:
            start = self.segments[-1].end if self.segments else 0.0
            self.anomalies.append(f"segment {len(self.segments)}: no start timestamp, start set to {start:.2f}")
            self._open(start, token)
        else:
            self.speaker, self.body = token.speaker, []

    def _time(self, token: _Token, next_kind: _Kind | None) -> None:
        if self.speaker is None:
            if self.start is not None:
                self.anomalies.append(f"stray timestamp {_stamp(self.start)} ignored")
            self.start, self.start_pos = token.time, token.pos
            return
        has_text = bool(self._body())
        if next_kind == "spk":  # this stamp opens the next header, so the open segment lost its end
            if has_text:
                self._close(token.time, f"no end timestamp, end set to next start {token.time:.2f}")
            else:
                self._drop_empty()
            self.start, self.start_pos = token.time, token.pos
        elif has_text:
            self._close(token.time, None)
        else:
            self._drop_empty()

    def _open(self, start: float, token: _Token) -> None:
        self.start, self.speaker, self.body, self.start_pos = start, token.speaker, [], token.pos

    def _body(self) -> str:
        return "".join(self.body).strip()

    def _close(self, end: float, note: str | None) -> None:
        start = self.start if self.start is not None else 0.0
        number = len(self.segments)
        if note:
            self.anomalies.append(f"segment {number}: {note}")
        if end < start:
            self.anomalies.append(f"segment {number}: end {end:.2f} before start {start:.2f}, end set to start")
            end = start
        self.segments.append(Segment(number, start, end, self.speaker or "", self._body()))
        self.start, self.speaker, self.body = None, None, []

    def _drop_empty(self) -> None:
        start = self.start if self.start is not None else 0.0
        self.anomalies.append(f"header [{self.speaker}] at {start:.2f} has no text, dropped")
        self.start, self.speaker, self.body = None, None, []

    def result(self) -> ParsedTranscript:
        """Freeze the state; an open construct or a cut-off tag is the incomplete tail."""
        tail_from = self.start_pos if self.start is not None else self.partial_pos
        return ParsedTranscript(
            segments=tuple(self.segments),
            incomplete_tail=self.raw[tail_from:] if tail_from is not None else "",
            tail_text=self._body() if self.speaker is not None else "",
            ends_inside_tag=self.partial_pos is not None,
            stray_text=tuple(self.stray),
            anomalies=tuple(self.anomalies),
        )


def _stamp(seconds: float) -> str:
    return f"[{seconds:.2f}]"
