"""The frozen qualification clip.

A 10.0 s (160000 samples) 16 kHz mono PCM-16 WAV in which two espeak-ng voices
(S01 = ``en-us+m3``, S02 = ``en-us+f2``) say four English sentences at known
offsets.  ``make_clip.py`` in this folder is the recipe; the WAV itself is frozen
and pinned by its SHA-256.  ``FROZEN_CLIP_TRANSCRIPT`` is the MOSS-format
transcript (``[start][Sxx]text[end]`` repeated, seconds with two decimals) taken
from the offsets and lengths of the placed utterances.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "FROZEN_CLIP_PATH",
    "FROZEN_CLIP_SHA256",
    "FROZEN_CLIP_TRANSCRIPT",
    "FROZEN_CLIP_SAMPLE_RATE",
    "FROZEN_CLIP_NUM_SAMPLES",
    "FROZEN_CLIP_SEGMENTS",
]

FROZEN_CLIP_PATH: Path = Path(__file__).resolve().with_name("moss_qualification_clip.wav")
FROZEN_CLIP_SHA256: str = "bb317d1a96ce4dcad67b1399a2c3e9a0cb4567e3cc32d92a1c4813e77669a763"
FROZEN_CLIP_SAMPLE_RATE: int = 16_000
FROZEN_CLIP_NUM_SAMPLES: int = 160_000

# (start_s, end_s, speaker, text), as in the transcript below
FROZEN_CLIP_SEGMENTS: tuple[tuple[float, float, str, str], ...] = (
    (0.50, 1.68, "S01", "Good morning everyone."),
    (2.60, 3.71, "S02", "The pipeline is ready."),
    (5.00, 6.43, "S01", "Let us check the numbers."),
    (7.60, 9.24, "S02", "Thank you, see you soon."),
)

FROZEN_CLIP_TRANSCRIPT: str = (
    "[0.50][S01]Good morning everyone.[1.68]"
    "[2.60][S02]The pipeline is ready.[3.71]"
    "[5.00][S01]Let us check the numbers.[6.43]"
    "[7.60][S02]Thank you, see you soon.[9.24]"
)
