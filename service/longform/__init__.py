"""The chunked long-form track: plan cuts, stitch chunk transcripts, link speakers.

Pure functions over arrays and parsed transcripts (no engine, no HTTP), so the
whole track is deterministic and testable; the serving path drives them:
`plan_cuts` -> transcribe each `Cut` -> `stitch` -> `link_speakers`.
"""

from service.longform.cuts import Boundary, ChunkingPolicy, Cut, CutPlan, from_request, plan_cuts, plan_sha256
from service.longform.speakers import LinkedSpeakers, OverlapLinks, SpeakerLink, link_speakers
from service.longform.stitch import (
    ChunkSegment,
    ChunkTranscript,
    Gap,
    MatchedPair,
    OverlapReport,
    StitchedSegment,
    StitchedTranscript,
    coverage_end_s,
    stitch,
)

__all__ = [
    "Boundary",
    "ChunkSegment",
    "ChunkTranscript",
    "ChunkingPolicy",
    "Cut",
    "CutPlan",
    "Gap",
    "LinkedSpeakers",
    "MatchedPair",
    "OverlapLinks",
    "OverlapReport",
    "SpeakerLink",
    "StitchedSegment",
    "StitchedTranscript",
    "coverage_end_s",
    "from_request",
    "link_speakers",
    "plan_cuts",
    "plan_sha256",
    "stitch",
]
