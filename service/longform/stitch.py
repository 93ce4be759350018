"""Stitch per-chunk transcripts into one: global times, one copy of each overlap segment.

Why it is built this way:
- Duplicates are found by time AND text: the two generations segment the same
  speech differently and their timestamps drift, so neither alone is reliable.
  Matched segments form groups (one segment may match two of the other chunk's),
  and each group keeps one chunk's copy whole, so words are neither doubled nor
  spliced from two generations.
- The kept copy is the one farther from its chunk's edge: near an edge the model
  lacks context and may hear a clipped word; a segment spanning a cut is only
  whole in the chunk that contains it, which is exactly the one farther from
  its edge.
- A segment with no counterpart is never dropped: losing words is worse than a
  rare doubled phrase, and the report shows every decision.
- A chunk that stopped early (stop class not "eos", or coverage ending before the
  overlap) is only trusted up to the end of its last complete segment, so its
  unfinished part cannot outvote the next chunk; audio neither chunk covered is
  reported as a gap rather than silently lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from service.longform.cuts import Cut
from service.longform.matching import overlap_s, text_similarity, time_score
from service.transcript import ParsedTranscript

#: A pair of segments is the same speech when both scores reach these.
MIN_TIME_SCORE = 0.3
MIN_TEXT_SCORE = 0.5


@dataclass(frozen=True)
class ChunkTranscript:
    """One chunk's result: its cut, its parsed output (chunk-local times and speakers), its stop class."""

    cut: Cut
    transcript: ParsedTranscript
    stop: str


@dataclass(frozen=True)
class ChunkSegment:
    """A segment of one chunk in global time; `speaker` is still the chunk-local label."""

    chunk: int
    local_id: int
    start: float
    end: float
    speaker: str
    text: str


@dataclass(frozen=True)
class StitchedSegment:
    """A kept segment with its global id; `speaker` is chunk-local until speakers are linked."""

    id: int
    chunk: int
    local_id: int
    start: float
    end: float
    speaker: str
    text: str


@dataclass(frozen=True)
class MatchedPair:
    """Two copies judged to be the same speech; `kept_chunk` is the chunk whose copy stayed."""

    left: ChunkSegment
    right: ChunkSegment
    overlap_s: float
    time_score: float
    text_score: float
    kept_chunk: int


@dataclass(frozen=True)
class Gap:
    """A chunk that stopped early: its transcript ends at `start_s`, its audio at `end_s`.

    `lost_s` is the part of that span no other chunk transcribed (0.0 when the
    next chunk's overlap reaches back past `start_s`); `tail_text` is the
    unfinished words after the last complete segment, kept here so no word
    disappears unreported.
    """

    chunk: int
    start_s: float
    end_s: float
    lost_s: float
    stop: str
    tail_text: str
    reason: str


@dataclass(frozen=True)
class OverlapReport:
    """What happened in the overlap between chunks `left` and `left + 1`."""

    left: int
    right: int
    start_s: float
    end_s: float
    left_stop: str
    left_stopped_early: bool
    left_coverage_end_s: float
    pairs: tuple[MatchedPair, ...]
    dropped: tuple[ChunkSegment, ...]
    gap: Gap | None


@dataclass(frozen=True)
class StitchedTranscript:
    """Global segments sorted by start, and the evidence of how they were stitched."""

    segments: tuple[StitchedSegment, ...]
    overlaps: tuple[OverlapReport, ...]
    gaps: tuple[Gap, ...]
    chunk_speakers: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join(segment.text for segment in self.segments)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"text": self.text}


def stitch(chunks: Sequence[ChunkTranscript]) -> StitchedTranscript:
    """Offset every chunk to global time, de-duplicate each overlap, report gaps."""
    ordered = sorted(chunks, key=lambda chunk: chunk.cut.index)
    if [chunk.cut.index for chunk in ordered] != list(range(len(ordered))):
        raise ValueError("chunks must be numbered 0..n-1 without gaps or repeats")
    notes: list[str] = []
    placed = [_place(chunk, notes) for chunk in ordered]
    dropped: set[tuple[int, int]] = set()
    reports = []
    for index in range(len(ordered) - 1):
        report = _overlap(ordered[index], ordered[index + 1], placed[index], placed[index + 1])
        dropped.update((segment.chunk, segment.local_id) for segment in report.dropped)
        reports.append(report)
    gaps = [report.gap for report in reports if report.gap is not None]
    if ordered:
        gaps.extend(_final_gap(ordered[-1]))
    kept = sorted(
        (segment for chunk in placed for segment in chunk if (segment.chunk, segment.local_id) not in dropped),
        key=lambda s: (s.start, s.end, s.chunk, s.local_id),
    )
    return StitchedTranscript(
        segments=tuple(
            StitchedSegment(number, s.chunk, s.local_id, s.start, s.end, s.speaker, s.text)
            for number, s in enumerate(kept)
        ),
        overlaps=tuple(reports),
        gaps=tuple(gaps),
        chunk_speakers=tuple(chunk.transcript.speakers for chunk in ordered),
        notes=tuple(notes),
    )


def coverage_end_s(chunk: ChunkTranscript) -> float:
    """Global time up to which the chunk provably transcribed: its last complete segment."""
    last = chunk.transcript.last_end
    return round(min(chunk.cut.start_s + (last or 0.0), chunk.cut.end_s), 3)


def _place(chunk: ChunkTranscript, notes: list[str]) -> list[ChunkSegment]:
    """Global-time segments; times outside the chunk are clamped to it and noted."""
    cut, placed = chunk.cut, []
    for segment in chunk.transcript.segments:
        start, end = round(cut.start_s + segment.start, 3), round(cut.start_s + segment.end, 3)
        if end > cut.end_s + 0.5 or start < cut.start_s:
            notes.append(f"chunk {cut.index} segment {segment.id}: [{start:.3f}, {end:.3f}] clamped to the chunk")
        start, end = min(max(start, cut.start_s), cut.end_s), min(max(end, cut.start_s), cut.end_s)
        placed.append(ChunkSegment(cut.index, segment.id, start, end, segment.speaker, segment.text))
    return placed


def _overlap(
    left: ChunkTranscript, right: ChunkTranscript, left_segs: list[ChunkSegment], right_segs: list[ChunkSegment]
) -> OverlapReport:
    start, end = right.cut.start_s, left.cut.end_s
    covered = coverage_end_s(left)
    early = left.stop != "eos" or covered < start
    edge = min(covered, end) if early else end
    tail = [s for s in left_segs if s.end > start]
    head = [s for s in right_segs if s.start < end]
    edges = _edges(tail, head)
    groups = _groups(len(tail), len(head), edges)
    pairs: list[MatchedPair] = []
    dropped: list[ChunkSegment] = []
    for lefts, rights in groups:
        left_margin = edge - max(tail[i].end for i in lefts)
        right_margin = min(head[j].start for j in rights) - start
        keep_left = left_margin >= right_margin
        if keep_left:
            dropped.extend(head[j] for j in rights)
        else:
            dropped.extend(tail[i] for i in lefts)
        kept_chunk = left.cut.index if keep_left else right.cut.index
        for i, j, shared, t_score, x_score in edges:
            if i in lefts:
                pairs.append(MatchedPair(tail[i], head[j], shared, t_score, x_score, kept_chunk))
    gap = _gap(left, covered, start) if early else None
    return OverlapReport(
        left=left.cut.index,
        right=right.cut.index,
        start_s=start,
        end_s=end,
        left_stop=left.stop,
        left_stopped_early=early,
        left_coverage_end_s=covered,
        pairs=tuple(pairs),
        dropped=tuple(sorted(dropped, key=lambda s: (s.start, s.chunk, s.local_id))),
        gap=gap,
    )


_Edge = tuple[int, int, float, float, float]


def _edges(tail: list[ChunkSegment], head: list[ChunkSegment]) -> list[_Edge]:
    """Every (left, right) pair that is the same speech, with its shared seconds and scores."""
    found = []
    for i, a in enumerate(tail):
        for j, b in enumerate(head):
            t_score = time_score(a.start, a.end, b.start, b.end)
            if t_score < MIN_TIME_SCORE:
                continue
            x_score = text_similarity(a.text, b.text)
            if x_score >= MIN_TEXT_SCORE:
                shared = overlap_s(a.start, a.end, b.start, b.end)
                found.append((i, j, round(shared, 3), round(t_score, 3), round(x_score, 3)))
    return found


def _groups(n_left: int, n_right: int, edges: list[_Edge]) -> list[tuple[list[int], list[int]]]:
    """Connected groups of matched segments (union-find), in time order."""
    parent = list(range(n_left + n_right))

    def root(node: int) -> int:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for i, j, *_ in edges:
        a, b = root(i), root(n_left + j)
        parent[max(a, b)] = min(a, b)
    members: dict[int, tuple[list[int], list[int]]] = {}
    for i, j, *_ in edges:
        for node in (i, n_left + j):
            lefts, rights = members.setdefault(root(node), ([], []))
            side, value = (lefts, node) if node < n_left else (rights, node - n_left)
            if value not in side:
                side.append(value)
    return [(sorted(lefts), sorted(rights)) for _, (lefts, rights) in sorted(members.items())]


def _gap(chunk: ChunkTranscript, covered: float, next_start: float) -> Gap:
    """Describe an early stop; `next_start` is where the next chunk begins (the audio end for the last)."""
    lost = round(max(0.0, next_start - covered), 3)
    if chunk.stop == "eos":
        why = f"ended on its end token at {covered:.3f} s, before the overlap (silence there, or an early stop)"
    else:
        why = f"stopped by {chunk.stop} at {covered:.3f} s"
    reason = f"chunk {chunk.cut.index} {why}; {lost:.3f} s not transcribed by any chunk"
    return Gap(chunk.cut.index, covered, chunk.cut.end_s, lost, chunk.stop, chunk.transcript.tail_text, reason)


def _final_gap(last: ChunkTranscript) -> list[Gap]:
    """The last chunk's uncovered tail, when it did not end on its own end token.

    An "eos" last chunk whose segments end before the audio does is not flagged:
    from the text alone, trailing silence or music and an early end token look
    the same (the caller's coverage measure still shows the uncovered tail).
    """
    covered = coverage_end_s(last)
    if last.stop == "eos" or covered >= last.cut.end_s:
        return []
    return [_gap(last, covered, last.cut.end_s)]
