"""The frozen qualification clip.

A 10.0 s (160000 samples) 16 kHz mono PCM-16 WAV in which two espeak-ng voices
(S01 = ``en-us+m3``, S02 = ``en-us+f2``) say four English sentences at known
offsets.  ``make_clip.py`` in this folder is the recipe; the WAV itself is frozen
and pinned by its SHA-256.  ``FROZEN_CLIP_TRANSCRIPT`` is the MOSS-format
transcript (``[start][Sxx]text[end]`` repeated, seconds with two decimals) taken
from the offsets and lengths of the placed utterances.

The tail clip (``recovery_tail_clip.wav``, 8.0 s, same voices, other words, recipe
``make_clip.py --tail``) is not used by qualification: the tiny checkpoint is taught
to stop early when it follows the frozen clip, and to transcribe it in the tail
recovery's further pass (tests/integration/test_tail_recovery_engine.py).
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
    "TAIL_CLIP_PATH",
    "TAIL_CLIP_SHA256",
    "TAIL_CLIP_NUM_SAMPLES",
    "TAIL_CLIP_SEGMENTS",
    "TAIL_CLIP_TRANSCRIPT",
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

TAIL_CLIP_PATH: Path = Path(__file__).resolve().with_name("recovery_tail_clip.wav")
TAIL_CLIP_SHA256: str = "517fca51ff207894b9551b697aea0a16ab3ab5eadfb7138028bed0438575f4dc"
TAIL_CLIP_NUM_SAMPLES: int = 128_000

TAIL_CLIP_SEGMENTS: tuple[tuple[float, float, str, str], ...] = (
    (0.40, 1.67, "S02", "Now the weather report."),
    (2.50, 3.87, "S01", "Rain will clear by noon."),
    (4.80, 6.12, "S02", "Take an umbrella anyway."),
)

TAIL_CLIP_TRANSCRIPT: str = (
    "[0.40][S02]Now the weather report.[1.67]"
    "[2.50][S01]Rain will clear by noon.[3.87]"
    "[4.80][S02]Take an umbrella anyway.[6.12]"
)
