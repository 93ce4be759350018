"""Parse MOSS output, `[start][Sxx]text[end]` repeated, into segments, as it streams.

Why a tolerant state machine rather than one strict regex: real generations
stop anywhere (inside a tag, after a header, mid-sentence), occasionally drop
a timestamp, or write plain text. A strict pattern would lose those words or
raise; here every complete segment is kept, every repair is recorded in
`anomalies`, and whatever does not fit lands in `stray_text` or the incomplete
tail, so the caller can always tell what was cut and no word disappears.

Why one incremental parser: the stream and the final answer must agree. The
stream's clean text deltas and settled segments come from the same object that
later freezes the final transcript, so deltas add up to the final text and the
streamed segments are exactly the final ones, however the text was split into
deltas. A piece of text is only reported once nothing that can still arrive
may change it: a tag is final once its `]` arrives (no tag can contain `[`), and
a timestamp's meaning waits for the next tag (it may end a segment or start one).
"""

from __future__ import annotations

import re
import unicodedata
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Literal

# A complete tag: a timestamp (integer or decimal seconds) or a speaker (S01).
# Bounded digit runs keep every timestamp finite and the regex linear.
_TAG = re.compile(r"\[\s*(?:(?P<time>\d{1,12}(?:\.\d{0,12})?|\.\d{1,12})|[Ss]\s*(?P<spk>\d{1,6}))\s*\]")
# Every prefix of a tag without its `]`: what the text may end with while a tag is still arriving.
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
    #: Where the segment lies in the raw output (character offsets), to find its tokens.
    span: tuple[int, int] = field(default=(0, 0), compare=False)
    #: The end as the model wrote it, when it ran backwards (before the start) and was set to the start.
    written_end: float | None = None


@dataclass(frozen=True)
class TextDelta:
    """Clean text added to the transcript's `text`; `segment` is the id it belongs to (None: outside segments)."""

    text: str
    segment: int | None


@dataclass(frozen=True)
class ParsedTranscript:
    """Everything the raw output contained, sorted into what can be trusted.

    `incomplete_tail` is the raw text of the unfinished last construct (from
    its first tag to the end, or just a cut-off tag); `tail_text` is its words.
    `text` is the clean transcript: segment texts and the unfinished tail in
    order, joined the way the script needs (no space between CJK pieces); text
    outside segments only when nothing else was transcribed.
    """

    segments: tuple[Segment, ...]
    incomplete_tail: str
    tail_text: str
    ends_inside_tag: bool
    stray_text: tuple[str, ...]
    anomalies: tuple[str, ...]
    text: str = ""

    @classmethod
    def from_segments(cls, segments: tuple[Segment, ...], anomalies: tuple[str, ...] = ()) -> ParsedTranscript:
        """A transcript assembled from finished segments (the chunked track's stitched result)."""
        return cls(segments, "", "", False, (), anomalies, join_text(s.text for s in segments))

    @property
    def last_end(self) -> float | None:
        """End of the last complete segment: how far the transcript provably reaches."""
        return self.segments[-1].end if self.segments else None

    @property
    def speakers(self) -> tuple[str, ...]:
        """Speaker labels in order of first appearance."""
        return tuple(dict.fromkeys(s.speaker for s in self.segments))


def separator(before: str, after: str) -> str:
    """What goes between two pieces of transcript: a space, except next to CJK text or existing space."""
    if not before or not after or before[-1].isspace() or after[0].isspace():
        return ""
    return "" if _is_cjk(before[-1]) or _is_cjk(after[0]) else " "


def join_text(pieces: Iterable[str]) -> str:
    """Join pieces with `separator` (the same rule the stream applies delta by delta)."""
    text = ""
    for piece in pieces:
        if piece:
            text += separator(text, piece) + piece
    return text


def _is_cjk(char: str) -> bool:
    """Chinese and Japanese script and their full-width punctuation: written without spaces between words."""
    code = ord(char)
    if 0x3000 <= code <= 0x30FF or 0x3400 <= code <= 0x9FFF or 0xF900 <= code <= 0xFAFF or 0xFF00 <= code <= 0xFFEF:
        return True
    return 0x20000 <= code <= 0x3FFFF or unicodedata.east_asian_width(char) == "W" and not char.isalnum()


def parse_transcript(raw: str) -> ParsedTranscript:
    """Split raw model output into segments; never raises on any string."""
    parser = TranscriptParser()
    parser.feed(raw)
    return parser.finish()


@dataclass(frozen=True)
class _Token:
    kind: _Kind
    raw: str
    pos: int
    time: float = 0.0
    speaker: str = ""


class _Tokenizer:
    """Splits growing text into tags and the text between them, each reported once it is final.

    Text that can no longer be part of a tag (everything before the last `[`
    that could still open one) is kept aside without being scanned again, so
    feeding a long output token by token stays linear.
    """

    def __init__(self) -> None:
        self.parts: list[str] = []  # the whole raw text, for the incomplete tail
        self.settled_text: list[str] = []  # text since the last tag that no tag can claim
        self.scan = ""  # from the last `[` that may still open a tag
        self.text_pos = 0  # where the text since the last tag begins
        self.scan_pos = 0  # where `scan` begins

    def feed(self, delta: str) -> list[_Token]:
        self.parts.append(delta)
        if not self.scan and "[" not in delta:
            self.settled_text.append(delta)
            self.scan_pos += len(delta)
            return []
        self.scan += delta
        tokens: list[_Token] = []
        cursor = 0
        for match in _TAG.finditer(self.scan):
            self.settled_text.append(self.scan[cursor : match.start()])
            self._flush_text(tokens)
            tag_pos = self.scan_pos + match.start()
            if match.group("time") is not None:
                tokens.append(_Token("time", match.group(0), tag_pos, time=float(match.group("time"))))
            else:
                tokens.append(_Token("spk", match.group(0), tag_pos, speaker="S" + match.group("spk")))
            cursor = match.end()
            self.text_pos = self.scan_pos + cursor
        self._settle(cursor)
        return tokens

    def pending_text(self) -> str:
        """Text after the last tag that is certainly text (it will reach the parser with the next tag)."""
        return "".join(self.settled_text)

    def finish(self) -> list[_Token]:
        """The rest: text, and a cut-off tag if the output ended inside one."""
        rest = "".join(self.settled_text) + self.scan
        tokens: list[_Token] = []
        bracket = rest.rfind("[")
        if bracket >= 0 and len(rest) - bracket <= _PARTIAL_MAX and _PARTIAL_TAG.fullmatch(rest, bracket):
            if bracket > 0:
                tokens.append(_Token("text", rest[:bracket], self.text_pos))
            tokens.append(_Token("partial", rest[bracket:], self.text_pos + bracket))
        elif rest:
            tokens.append(_Token("text", rest, self.text_pos))
        self.settled_text, self.scan = [], ""
        return tokens

    def raw(self) -> str:
        return "".join(self.parts)

    def _flush_text(self, tokens: list[_Token]) -> None:
        text = "".join(self.settled_text)
        if text:
            tokens.append(_Token("text", text, self.text_pos))
        self.settled_text = []

    def _settle(self, cursor: int) -> None:
        """Keep scanning only from the last `[` that can still open a tag."""
        rest = self.scan[cursor:]
        start = self.scan_pos + cursor
        bracket = rest.rfind("[")
        if bracket >= 0 and _PARTIAL_TAG.fullmatch(rest, bracket):
            self.settled_text.append(rest[:bracket])
            self.scan, self.scan_pos = rest[bracket:], start + bracket
        else:
            self.settled_text.append(rest)
            self.scan, self.scan_pos = "", start + len(rest)


class TranscriptParser:
    """Three states: nothing open; a start stamp waiting for its speaker
    (`start` set, `speaker` None); an open segment (`start` and `speaker` set).

    `feed` returns what became final: clean text deltas and closed segments.
    `finish` freezes the result; the text of all deltas (those of `finish`
    included) is exactly the final transcript's `text`.
    """

    def __init__(self) -> None:
        self._tokens = _Tokenizer()
        self._queue: deque[_Token] = deque()
        self.segments: list[Segment] = []
        self.stray: list[str] = []
        self.anomalies: list[str] = []
        self.start: float | None = None
        self.speaker: str | None = None
        self.body: list[str] = []
        self.start_pos = 0  # where the unfinished construct begins in raw
        self.partial_pos: int | None = None
        self.text = ""
        self._body_sent = 0  # characters of the open body's stripped text already sent
        self._deltas: list[TextDelta] = []
        self._closed: list[Segment] = []

    # -- feeding ----------------------------------------------------------
    def feed(self, delta: str) -> tuple[list[TextDelta], list[Segment]]:
        """Add raw output; returns the text deltas and segments that became final."""
        self._queue.extend(self._tokens.feed(delta))
        self._drain(final=False)
        if self.speaker is not None and not self._queue:
            self._send_body("".join(self.body) + self._tokens.pending_text(), closing=False)
        return self._take()

    def finish(self) -> ParsedTranscript:
        """Everything is in: settle the rest and freeze the transcript."""
        self._queue.extend(self._tokens.finish())
        self._drain(final=True)
        if self.speaker is not None:
            self._send_body("".join(self.body), closing=True)
        if not self.segments and not self.text:  # plain text with no segment: its words are the transcript
            for piece in self.stray:
                self._send(piece, None)
        raw = self._tokens.raw()
        tail_from = self.start_pos if self.start is not None else self.partial_pos
        return ParsedTranscript(
            segments=tuple(self.segments),
            incomplete_tail=raw[tail_from:] if tail_from is not None else "",
            tail_text=self._body() if self.speaker is not None else "",
            ends_inside_tag=self.partial_pos is not None,
            stray_text=tuple(self.stray),
            anomalies=tuple(self.anomalies),
            text=self.text,
        )

    def take_final(self) -> tuple[list[TextDelta], list[Segment]]:
        """The deltas and segments `finish` settled (call after `finish`)."""
        return self._take()

    def _take(self) -> tuple[list[TextDelta], list[Segment]]:
        deltas, closed = self._deltas, self._closed
        self._deltas, self._closed = [], []
        return deltas, closed

    def _drain(self, *, final: bool) -> None:
        while self._queue:
            token = self._queue[0]
            next_kind: _Kind | None = None
            if token.kind == "time":
                known, next_kind = self._lookahead()
                if not known and not final:
                    return
            self._queue.popleft()
            self._process(token, next_kind)

    def _lookahead(self) -> tuple[bool, _Kind | None]:
        """Kind of the next token that is not whitespace, and whether it is known yet."""
        for ahead in islice(self._queue, 1, 3):  # text tokens never touch, so 2 ahead at most
            if ahead.kind != "text" or ahead.raw.strip():
                return True, ahead.kind
        if self._tokens.pending_text().strip():
            return True, "text"
        return False, None

    def _process(self, token: _Token, next_kind: _Kind | None) -> None:
        if token.kind == "text":
            self._text(token)
        elif token.kind == "spk":
            self._speaker(token)
        elif token.kind == "time":
            self._time(token, next_kind)
        else:
            self.partial_pos = token.pos

    # -- the state machine ----------------------------------------------------
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
                self._close(boundary, f"no timestamp before speaker {token.speaker}, end set to start", token.pos)
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
            self.speaker, self.body, self._body_sent = token.speaker, [], 0

    def _time(self, token: _Token, next_kind: _Kind | None) -> None:
        if self.speaker is None:
            if self.start is not None:
                self.anomalies.append(f"stray timestamp {_stamp(self.start)} ignored")
            self.start, self.start_pos = token.time, token.pos
            return
        has_text = bool(self._body())
        if next_kind == "spk":  # this stamp opens the next header, so the open segment lost its end
            if has_text:
                self._close(token.time, f"no end timestamp, end set to next start {token.time:.2f}", token.pos)
            else:
                self._drop_empty()
            self.start, self.start_pos = token.time, token.pos
        elif has_text:
            self._close(token.time, None, token.pos + len(token.raw))
        else:
            self._drop_empty()

    def _open(self, start: float, token: _Token) -> None:
        self.start, self.speaker, self.body, self.start_pos = start, token.speaker, [], token.pos
        self._body_sent = 0

    def _body(self) -> str:
        return "".join(self.body).strip()

    def _close(self, end: float, note: str | None, until: int) -> None:
        start = self.start if self.start is not None else 0.0
        number = len(self.segments)
        if note:
            self.anomalies.append(f"segment {number}: {note}")
        written_end = None
        if end < start:
            self.anomalies.append(f"segment {number}: end {end:.2f} before start {start:.2f}, end set to start")
            end, written_end = start, end
        self._send_body("".join(self.body), closing=True)
        segment = Segment(number, start, end, self.speaker or "", self._body(), (self.start_pos, until), written_end)
        self.segments.append(segment)
        self._closed.append(segment)
        self.start, self.speaker, self.body = None, None, []

    def _drop_empty(self) -> None:
        start = self.start if self.start is not None else 0.0
        self.anomalies.append(f"header [{self.speaker}] at {start:.2f} has no text, dropped")
        self.start, self.speaker, self.body = None, None, []

    # -- clean text -------------------------------------------------------------
    def _send_body(self, visible: str, *, closing: bool) -> None:
        """Send the open segment's words as they become certain; trailing space waits for what follows it."""
        words = visible.lstrip()
        end = len(words.rstrip())
        if end > self._body_sent:
            self._send(words[self._body_sent : end], len(self.segments), continuing=self._body_sent > 0)
            self._body_sent = end
        if closing:
            self._body_sent = 0

    def _send(self, piece: str, segment: int | None, *, continuing: bool = False) -> None:
        text = piece if continuing else separator(self.text, piece) + piece
        self.text += text
        self._deltas.append(TextDelta(text, segment))


def _stamp(seconds: float) -> str:
    return f"[{seconds:.2f}]"
