"""Link chunk-local speakers (each chunk restarts at S01) into global speakers.

Why it is built this way:
- The only evidence is the overlaps: a segment both chunks transcribed (matched
  in time and text by `stitch`) was said by one person, so its two local labels
  vote to be the same speaker, weighted by shared seconds x text similarity.
- Each overlap is solved one-to-one, greedily from the strongest vote: a chunk's
  two labels are the model's claim of two people, and merging them on indirect
  evidence would be a worse error than leaving one person split.
- A link needs enough evidence (confidence >= `min_confidence`); otherwise the
  speakers stay apart under a new global label and the report says why. Wrong
  merges hide a speaker; a split is visible and cheap to fix by hand.
- Links only join adjacent chunks one-to-one, so each global speaker is a chain
  through consecutive chunks and can never hold two labels of one chunk. A
  speaker silent in a whole overlap gets a new label (no voice evidence here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from service.longform.stitch import OverlapReport, StitchedTranscript
from service.transcript import Segment

#: A link is accepted from this confidence on. With unanimous votes this needs
#: about 1.4 s of matched speech at full text similarity (1 - exp(-1.4 / 2) = 0.5).
MIN_CONFIDENCE = 0.5
#: Matched seconds (x similarity) at which evidence strength reaches 1 - 1/e.
EVIDENCE_SCALE_S = 2.0

Node = tuple[int, str]  # (chunk index, chunk-local label)


@dataclass(frozen=True)
class SpeakerLink:
    """One candidate link `left_speaker` (chunk `left_chunk`) == `right_speaker` (next chunk).

    `support` is the sum of shared seconds x text similarity over the matched
    segments; `purity` is the share of both speakers' votes that agree with this
    link (1.0 when unanimous); confidence = purity x (1 - exp(-support / 2 s)).
    """

    left_chunk: int
    left_speaker: str
    right_chunk: int
    right_speaker: str
    segments: int
    seconds: float
    mean_similarity: float
    support: float
    purity: float
    confidence: float
    accepted: bool
    reason: str


@dataclass(frozen=True)
class OverlapLinks:
    """The links proposed in one overlap; `confidence` is the weakest accepted link's
    (or the best rejected one's when none was accepted, 0.0 without any evidence)."""

    left: int
    right: int
    links: tuple[SpeakerLink, ...]
    confidence: float
    note: str


@dataclass(frozen=True)
class LinkedSpeakers:
    """Global speakers: the label map, the evidence, and the relabelled segments."""

    mapping: dict[Node, str]
    overlaps: tuple[OverlapLinks, ...]
    segments: tuple[Segment, ...]
    notes: tuple[str, ...]

    @property
    def speakers(self) -> tuple[str, ...]:
        """Global labels in order of first appearance in the transcript."""
        return tuple(dict.fromkeys(segment.speaker for segment in self.segments))

    def as_dict(self) -> dict[str, Any]:
        return {
            "mapping": [{"chunk": c, "local": local, "global": g} for (c, local), g in self.mapping.items()],
            "overlaps": [
                {
                    "left": o.left,
                    "right": o.right,
                    "confidence": o.confidence,
                    "note": o.note,
                    "links": [vars(link).copy() for link in o.links],
                }
                for o in self.overlaps
            ],
            "notes": list(self.notes),
        }


def link_speakers(
    stitched: StitchedTranscript,
    *,
    min_confidence: float = MIN_CONFIDENCE,
    evidence_scale_s: float = EVIDENCE_SCALE_S,
) -> LinkedSpeakers:
    """Vote, link and label: S01, S02, ... in order of first appearance in the transcript."""
    overlaps = tuple(_link_overlap(report, min_confidence, evidence_scale_s) for report in stitched.overlaps)
    listed = [(chunk, label) for chunk, labels in enumerate(stitched.chunk_speakers) for label in labels]
    nodes = list(dict.fromkeys(listed + [(s.chunk, s.speaker) for s in stitched.segments]))
    parent: dict[Node, Node] = {node: node for node in nodes}

    def root(node: Node) -> Node:
        while parent[node] != node:
            node = parent[node]
        return node

    for overlap in overlaps:
        for link in overlap.links:
            if link.accepted:
                a, b = root((link.left_chunk, link.left_speaker)), root((link.right_chunk, link.right_speaker))
                parent[max(a, b)] = min(a, b)  # the earlier chunk's node stays the root
    labels: dict[Node, str] = {}
    for node in [(s.chunk, s.speaker) for s in stitched.segments] + nodes:
        labels.setdefault(root(node), f"S{len(labels) + 1:02d}")
    mapping = {node: labels[root(node)] for node in nodes}
    notes = [
        f"chunk {chunk} {local}: no link from chunk {chunk - 1}, kept apart as {mapping[(chunk, local)]}"
        for chunk, local in nodes
        if chunk > 0 and root((chunk, local)) == (chunk, local)
    ]
    return LinkedSpeakers(
        mapping=mapping,
        overlaps=overlaps,
        segments=tuple(Segment(s.id, s.start, s.end, mapping[(s.chunk, s.speaker)], s.text) for s in stitched.segments),
        notes=tuple(notes),
    )


def _link_overlap(report: OverlapReport, min_confidence: float, scale_s: float) -> OverlapLinks:
    """Tally the votes of one overlap and accept links greedily, strongest first."""
    votes: dict[tuple[str, str], list[float]] = {}  # [support, segments, seconds, similarity sum]
    for pair in report.pairs:
        tally = votes.setdefault((pair.left.speaker, pair.right.speaker), [0.0, 0.0, 0.0, 0.0])
        tally[0] += pair.overlap_s * pair.text_score
        tally[1] += 1
        tally[2] += pair.overlap_s
        tally[3] += pair.text_score
    rows: dict[str, float] = {}
    cols: dict[str, float] = {}
    for (a, b), tally in votes.items():
        rows[a] = rows.get(a, 0.0) + tally[0]
        cols[b] = cols.get(b, 0.0) + tally[0]
    linked_left: dict[str, str] = {}
    linked_right: dict[str, str] = {}
    links = []
    for (a, b), (support, count, seconds, similarity) in sorted(votes.items(), key=lambda kv: (-kv[1][0], kv[0])):
        total = rows[a] + cols[b] - support
        purity = support / total if total > 0 else 0.0
        confidence = round(purity * (1.0 - math.exp(-support / scale_s)), 3)
        if a in linked_left or b in linked_right:
            other = (
                f"{a} already linked to {linked_left[a]}"
                if a in linked_left
                else f"{b} already linked to {linked_right[b]}"
            )
            accepted, reason = False, f"conflict: {other}"
        elif confidence < min_confidence:
            accepted, reason = False, f"weak evidence: confidence {confidence:.2f} below {min_confidence:.2f}"
            if purity < 0.75:
                reason += f", conflicting votes (purity {purity:.2f})"
        else:
            accepted, reason = True, f"{int(count)} matched segments, {seconds:.2f} s"
            linked_left[a], linked_right[b] = b, a
        links.append(
            SpeakerLink(
                left_chunk=report.left,
                left_speaker=a,
                right_chunk=report.right,
                right_speaker=b,
                segments=int(count),
                seconds=round(seconds, 3),
                mean_similarity=round(similarity / count, 3),
                support=round(support, 3),
                purity=round(purity, 3),
                confidence=confidence,
                accepted=accepted,
                reason=reason,
            )
        )
    accepted_conf = [link.confidence for link in links if link.accepted]
    confidence = min(accepted_conf) if accepted_conf else max((link.confidence for link in links), default=0.0)
    if not links:
        note = f"no matched speech in the overlap: chunk {report.right} speakers kept apart from chunk {report.left}"
    else:
        note = f"{len(accepted_conf)} of {len(links)} candidate links accepted"
    return OverlapLinks(report.left, report.right, tuple(links), confidence, note)
