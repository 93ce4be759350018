"""Where the audio holds sound worth transcribing: a cheap, deterministic energy detector.

Why energy and not a VAD model: the question the stop evidence asks is "did the
transcript leave out something a person would want transcribed?", and the
answer must be the same on every machine, cost nothing next to the engine pass,
and need no weights. Frame levels (the ones the chunked track's cut planner
already computes) are compared with a threshold that adapts to the recording's
own noise floor, bounded both ways so that digital silence, faint room noise and
an all-speech recording are all judged sensibly. It errs towards "speech": music
or loud noise count too, which at worst asks for a recovery pass that finds
nothing, while a quiet tail is never mistaken for lost words.

The result is computed once per job (about 30 ms per audio minute) and is
immutable; passes over a span of the audio read a window of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.longform.levels import frame_levels_db, silence_runs


@dataclass(frozen=True)
class SpeechPolicy:
    """How frames are judged (values from `settings.CoverageSettings`)."""

    frame_s: float = 0.03
    #: A frame is sound when it is this far above the recording's noise floor...
    above_floor_db: float = 12.0
    #: ...but the threshold never drops below this (digital silence, dither) nor rises above `ceiling_db`
    #: (a recording with no pause at all has no floor to speak of).
    floor_db: float = -60.0
    ceiling_db: float = -40.0
    #: Pauses shorter than this inside sound count as sound; bursts shorter than `min_sound_s` do not.
    bridge_s: float = 0.3
    min_sound_s: float = 0.2
    #: The noise floor is this percentile of the frame levels.
    floor_percentile: float = 10.0


@dataclass(frozen=True)
class SpeechActivity:
    """Per-frame "sound here" flags of one recording (or a window of it), in audio time from 0."""

    frame_s: float
    active: tuple[bool, ...]
    duration_s: float
    threshold_db: float
    noise_floor_db: float

    @property
    def speech_s(self) -> float:
        return self.seconds(0.0, self.duration_s)

    def seconds(self, start_s: float, end_s: float) -> float:
        """Seconds of sound in [start_s, end_s), counting the partial frames at both edges by their share."""
        start_s, end_s = max(0.0, start_s), min(self.duration_s, end_s)
        if end_s <= start_s or not self.active:
            return 0.0
        first, last = int(start_s // self.frame_s), min(len(self.active) - 1, int(end_s // self.frame_s))
        total = 0.0
        for index in {first, last}:  # the edge frames, by the share of them inside the span
            if self.active[index]:
                lo, hi = index * self.frame_s, min((index + 1) * self.frame_s, self.duration_s)
                total += max(0.0, min(hi, end_s) - max(lo, start_s))
        if last > first + 1:  # whole frames between them, from the running count
            total += (self._counts[last] - self._counts[first + 1]) * self.frame_s
        return round(total, 3)

    @cached_property
    def _counts(self) -> tuple[int, ...]:
        """Active frames before each index: any span's count in constant time (long tails are measured often)."""
        return (0, *(int(n) for n in np.cumsum(self.active, dtype=np.int64)))

    def window(self, start_s: float, end_s: float) -> SpeechActivity:
        """The activity of [start_s, end_s), re-timed from 0 (a pass over a span of the audio)."""
        first = max(0, int(round(start_s / self.frame_s)))
        last = min(len(self.active), int(np.ceil(end_s / self.frame_s)))
        return SpeechActivity(
            self.frame_s, self.active[first:last], round(max(0.0, min(end_s, self.duration_s) - start_s), 3),
            self.threshold_db, self.noise_floor_db,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "detector": "energy",
            "speech_s": self.speech_s,
            "threshold_db": round(self.threshold_db, 2),
            "noise_floor_db": round(self.noise_floor_db, 2),
        }


def detect_speech(samples: NDArray[np.generic], sample_rate: int, policy: SpeechPolicy) -> SpeechActivity:
    """Frames whose level clears the adaptive threshold, with short pauses bridged and short bursts dropped."""
    duration = samples.shape[0] / sample_rate
    levels = frame_levels_db(samples, sample_rate, policy.frame_s)
    if levels.size == 0:
        return SpeechActivity(policy.frame_s, (), round(duration, 3), policy.floor_db, policy.floor_db)
    floor = float(np.percentile(levels, policy.floor_percentile))
    threshold = min(policy.ceiling_db, max(policy.floor_db, floor + policy.above_floor_db))
    active = levels > threshold
    bridge = max(1, round(policy.bridge_s / policy.frame_s))
    for start, end in silence_runs(~active, 1):
        if start > 0 and end < active.size and end - start < bridge:
            active[start:end] = True
    shortest = max(1, round(policy.min_sound_s / policy.frame_s))
    for start, end in silence_runs(active, 1):
        if end - start < shortest:
            active[start:end] = False
    return SpeechActivity(policy.frame_s, tuple(bool(x) for x in active), round(duration, 3), threshold, floor)
