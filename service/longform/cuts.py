"""Plan the chunked track's cuts from the audio itself, deterministically, and freeze them.

Why this way:
- Cuts go into pauses. A word cut in half is transcribed twice badly; a cut in a
  pause costs nothing. Each boundary is searched within `search_s` of its target
  (the previous boundary plus `target_s`), so chunks stay near the target size
  and never exceed `max_chunk_s`, overlap included.
- The silence threshold adapts to each search window (its quietest
  `min_silence_s` stretch vs its median level, see `policy`), so loud and quiet
  programs, and a noise floor that drifts over three hours, are treated alike;
  an operator may still pin `threshold_db`.
- Each chunk after the first starts `overlap_s` before its boundary, so the
  speech just before every cut is heard by both chunks: stitching uses that to
  drop duplicates and to link the chunks' speakers.
- The plan is frozen: times are rounded to milliseconds and hashed together with
  the policy and the audio's sha256, so the ledger can prove which cuts produced
  a transcript and a replay can check it gets the same ones.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from service.longform.levels import frame_length, frame_levels_db, moving_mean, silence_runs
from service.longform.policy import ChunkingPolicy, from_request

__all__ = ["Boundary", "ChunkingPolicy", "Cut", "CutPlan", "from_request", "plan_cuts", "plan_sha256"]

#: A window whose quietest 0.3 s is less than this below its median has no pause
#: worth the name (continuous music, steady noise): cut at its quietest point.
MIN_CONTRAST_DB = 10.0
#: Levels are compared at this resolution, so float noise cannot pick a cut and
#: equally quiet candidates are decided by distance to the target instead.
_LEVEL_STEP_DB = 0.1

BoundaryKind = Literal["silence", "quietest", "fixed"]


@dataclass(frozen=True)
class Cut:
    """One chunk's span in the original audio, in seconds (millisecond-rounded)."""

    index: int
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return round(self.end_s - self.start_s, 3)

    def sample_span(self, sample_rate: int) -> tuple[int, int]:
        """[first, last) sample indices of this chunk at `sample_rate`."""
        return round(self.start_s * sample_rate), round(self.end_s * sample_rate)

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "start_s": self.start_s, "end_s": self.end_s}


@dataclass(frozen=True)
class Boundary:
    """Why a chunk ends where it does: the pause (or quietest stretch) that was chosen.

    `kind` is "silence" (a run below the threshold), "quietest" (no pause long or
    deep enough: the quietest `min_silence_s` window) or "fixed" (no room to search).
    `threshold_db` is None when no threshold applied (no contrast, or "fixed").
    """

    at_s: float
    kind: BoundaryKind
    region_start_s: float
    region_end_s: float
    level_db: float
    threshold_db: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "at_s": self.at_s,
            "kind": self.kind,
            "region_start_s": self.region_start_s,
            "region_end_s": self.region_end_s,
            "level_db": self.level_db,
            "threshold_db": self.threshold_db,
        }


@dataclass(frozen=True)
class CutPlan:
    """The frozen cut list; `sha256` covers cuts, policy, duration, rate and audio hash."""

    cuts: tuple[Cut, ...]
    policy: ChunkingPolicy
    duration_s: float
    sha256: str
    audio_sha256: str
    sample_rate: int
    boundaries: tuple[Boundary, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "audio_sha256": self.audio_sha256,
            "sample_rate": self.sample_rate,
            "duration_s": self.duration_s,
            "policy": self.policy.as_dict(),
            "cuts": [cut.as_dict() for cut in self.cuts],
            "boundaries": [boundary.as_dict() for boundary in self.boundaries],
        }


def plan_sha256(
    cuts: tuple[Cut, ...], policy: ChunkingPolicy, *, duration_s: float, sample_rate: int, audio_sha256: str
) -> str:
    """Hash of the canonical plan: integer milliseconds and sorted-key compact JSON."""
    canonical = {
        "audio_sha256": audio_sha256,
        "sample_rate": sample_rate,
        "duration_ms": _ms(duration_s),
        "policy": {k: (None if v is None else round(v, 6)) for k, v in policy.as_dict().items()},
        "cuts": [[cut.index, _ms(cut.start_s), _ms(cut.end_s)] for cut in cuts],
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def plan_cuts(samples: NDArray[np.generic], sample_rate: int, *, policy: ChunkingPolicy, audio_sha256: str) -> CutPlan:
    """Choose the cuts for `samples` (mono); same samples and policy, same plan and hash."""
    duration = samples.shape[0] / sample_rate if sample_rate > 0 else 0.0
    levels = frame_levels_db(samples, sample_rate, policy.frame_s)
    hop = frame_length(policy.frame_s, sample_rate) / sample_rate
    boundaries: list[Boundary] = []
    previous = 0.0
    while True:
        remaining = duration - previous
        head = policy.overlap_s if boundaries else 0.0
        if remaining <= policy.target_s + policy.search_s and remaining + head <= policy.max_chunk_s:
            break
        target = previous + policy.target_s
        low = target - policy.search_s
        high = min(target + policy.search_s, previous + policy.max_chunk_s - head)
        boundary = _choose(levels, hop, low, high, target, policy)
        boundaries.append(boundary)
        previous = boundary.at_s
    cuts = _cuts_from(boundaries, duration, policy.overlap_s)
    return CutPlan(
        cuts=cuts,
        policy=policy,
        duration_s=round(duration, 3),
        sha256=plan_sha256(cuts, policy, duration_s=duration, sample_rate=sample_rate, audio_sha256=audio_sha256),
        audio_sha256=audio_sha256,
        sample_rate=sample_rate,
        boundaries=tuple(boundaries),
    )


def _cuts_from(boundaries: list[Boundary], duration: float, overlap_s: float) -> tuple[Cut, ...]:
    starts = [0.0] + [max(0.0, _round_ms(b.at_s - overlap_s)) for b in boundaries]
    ends = [b.at_s for b in boundaries] + [_round_ms(duration)]
    return tuple(Cut(index, start, end) for index, (start, end) in enumerate(zip(starts, ends, strict=True)))


def _choose(
    levels: NDArray[np.float64], hop: float, low: float, high: float, target: float, policy: ChunkingPolicy
) -> Boundary:
    """Best boundary in [low, high]: longest pause, then quietest, then nearest the target."""
    first = math.ceil(low / hop - 1e-9)
    last = min(math.floor(high / hop + 1e-9), levels.shape[0])
    if last - first < 1:
        at = _round_ms(min(max(target, low), high))
        return Boundary(at, "fixed", at, at, 0.0, None)
    window = levels[first:last]
    width = max(1, min(round(policy.min_silence_s / hop), window.shape[0]))
    smooth = _quantise(moving_mean(window, width))
    threshold = policy.threshold_db
    if threshold is None:
        floor, median = float(smooth.min()), float(np.median(window))
        if median - floor >= MIN_CONTRAST_DB:
            threshold = floor + policy.activation * (median - floor)
    if threshold is not None:
        runs = silence_runs(window < threshold, width)
        if runs.shape[0]:
            return _in_pause(runs, window, first, hop, target, high, threshold, policy.prefix_padding_s)
    centres = (np.arange(smooth.shape[0]) + width / 2 + first) * hop
    distance = np.round(np.abs(centres - target), 3)
    best = int(np.lexsort((np.arange(smooth.shape[0]), distance, smooth))[0])
    start, end = (first + best) * hop, (first + best + width) * hop
    at = min(_round_ms((start + end) / 2), _floor_ms(high))
    return Boundary(at, "quietest", _round_ms(start), _round_ms(end), round(float(smooth[best]), 2), _opt(threshold))


def _in_pause(
    runs: NDArray[np.int64],
    window: NDArray[np.float64],
    first: int,
    hop: float,
    target: float,
    high: float,
    threshold: float,
    padding_s: float,
) -> Boundary:
    """Centre of the best pause, moved earlier if needed to keep `padding_s` before the next speech."""
    sums = np.concatenate(([0.0], np.cumsum(window)))
    keys = []
    for row, (start, end) in enumerate(runs.tolist()):
        mean = round(round((sums[end] - sums[start]) / (end - start) / _LEVEL_STEP_DB) * _LEVEL_STEP_DB, 2)
        centre = (first + (start + end) / 2) * hop
        keys.append((-(end - start), mean, round(abs(centre - target), 3), start, row))
    _, mean, _, _, row = min(keys)
    start_s, end_s = (first + int(runs[row, 0])) * hop, (first + int(runs[row, 1])) * hop
    at = max(start_s, min((start_s + end_s) / 2, end_s - padding_s))
    at = min(_round_ms(at), _floor_ms(high))
    return Boundary(at, "silence", _round_ms(start_s), _round_ms(end_s), round(mean, 2), round(threshold, 2))


def _quantise(values: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.round(values / _LEVEL_STEP_DB) * _LEVEL_STEP_DB


def _opt(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _round_ms(seconds: float) -> float:
    return _ms(seconds) / 1000


def _floor_ms(seconds: float) -> float:
    return math.floor(seconds * 1000 + 1e-6) / 1000


def _ms(seconds: float) -> int:
    return math.floor(seconds * 1000 + 0.5)
