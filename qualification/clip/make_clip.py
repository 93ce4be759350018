"""Recipe for the frozen qualification clip (``moss_qualification_clip.wav``).

Two espeak-ng voices (``en-us+m3`` as S01, ``en-us+f2`` as S02) say four English
sentences.  Each utterance is synthesised at espeak-ng's native 22.05 kHz,
resampled to 16 kHz with soxr (VHQ), trimmed to its audible part, peak-normalised
and placed at a start offset that is a whole number of hundredths of a second,
with silence in between.  The result is exactly 10.0 s (160000 samples) of
16 kHz mono PCM-16.

The WAV in this folder is *frozen*: its SHA-256 and its MOSS-format transcript are
pinned in ``qualification/clip/__init__.py``.  This script regenerates it; a
different espeak-ng build may produce slightly different audio, so the pinned
file stays the reference.  Run::

    python -m qualification.clip.make_clip            # writes the WAV, prints metadata
    python -m qualification.clip.make_clip --check    # regenerates in memory, compares
    python -m qualification.clip.make_clip --tail     # the recovery tail clip (TAIL_SCRIPT)

The transcript is derived from the placement: ``[start][Sxx]text[end]`` with the
start/end in seconds (two decimals) of the trimmed, placed utterance.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

SAMPLE_RATE = 16_000
NUM_SAMPLES = 160_000  # exactly 10.0 s
ESPEAK = "/usr/bin/espeak-ng"
# The frozen WAV was made with this espeak-ng release; others may differ slightly.
PINNED_ESPEAK_VERSION = "1.51"
WORDS_PER_MINUTE = 160
SPEAKER_VOICES = {"S01": "en-us+m3", "S02": "en-us+f2"}

# (speaker, text, start offset in hundredths of a second)
SCRIPT: tuple[tuple[str, str, int], ...] = (
    ("S01", "Good morning everyone.", 50),
    ("S02", "The pipeline is ready.", 260),
    ("S01", "Let us check the numbers.", 500),
    ("S02", "Thank you, see you soon.", 760),
)

# The tail clip (``recovery_tail_clip.wav``, 8.0 s): different words, same two voices.  The tiny
# checkpoint is taught to stop after the frozen clip when this follows it (an early stop with speech
# left) and to transcribe it in the recovery pass that starts a little before the frozen clip ends.
TAIL_SCRIPT: tuple[tuple[str, str, int], ...] = (
    ("S02", "Now the weather report.", 40),
    ("S01", "Rain will clear by noon.", 250),
    ("S02", "Take an umbrella anyway.", 480),
)
TAIL_NUM_SAMPLES = 128_000  # exactly 8.0 s
TAIL_OUTPUT_NAME = "recovery_tail_clip.wav"

TRIM_THRESHOLD = 0.02  # relative to the utterance peak
SEGMENT_PEAK = 0.7  # every utterance is normalised to this peak (full scale 1.0)

OUTPUT_NAME = "moss_qualification_clip.wav"


@dataclass(frozen=True)
class Placed:
    speaker: str
    text: str
    start_sample: int
    num_samples: int

    @property
    def start_s(self) -> float:
        return self.start_sample / SAMPLE_RATE

    @property
    def end_s(self) -> float:
        return (self.start_sample + self.num_samples) / SAMPLE_RATE


def espeak_version() -> str | None:
    """The installed espeak-ng release ("1.51"), or None when it is missing."""
    try:
        out = subprocess.run([ESPEAK, "--version"], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    parts = out.split()
    return parts[parts.index("text-to-speech:") + 1] if "text-to-speech:" in parts else None


def synthesise(text: str, voice: str) -> np.ndarray:
    """espeak-ng -> float64 mono at 16 kHz, trimmed to the audible part."""
    wav_bytes = subprocess.run(
        [ESPEAK, "-v", voice, "-s", str(WORDS_PER_MINUTE), "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout
    data, sr = sf.read(io.BytesIO(wav_bytes), dtype="float64")
    if data.ndim > 1:
        data = data.mean(axis=1)
    data = soxr.resample(data, sr, SAMPLE_RATE, quality="VHQ")
    peak = float(np.max(np.abs(data)))
    loud = np.flatnonzero(np.abs(data) > TRIM_THRESHOLD * peak)
    data = data[loud[0] : loud[-1] + 1]
    # 5 ms fade in/out so the cut edges do not click
    fade = min(80, len(data) // 2)
    ramp = np.linspace(0.0, 1.0, fade)
    data[:fade] *= ramp
    data[-fade:] *= ramp[::-1]
    scaled: np.ndarray = data * (SEGMENT_PEAK / float(np.max(np.abs(data))))
    return scaled


def build(
    script: tuple[tuple[str, str, int], ...] = SCRIPT, num_samples: int = NUM_SAMPLES
) -> tuple[np.ndarray, list[Placed]]:
    out = np.zeros(num_samples, dtype=np.float64)
    placed: list[Placed] = []
    cursor = 0
    for speaker, text, start_cs in script:
        seg = synthesise(text, SPEAKER_VOICES[speaker])
        start = start_cs * SAMPLE_RATE // 100
        if start < cursor + SAMPLE_RATE // 5:
            raise RuntimeError(f"{text!r} overlaps the previous utterance; move it later")
        end = start + len(seg)
        if end > num_samples - SAMPLE_RATE // 5:
            raise RuntimeError(f"{text!r} runs past the end of the clip")
        out[start:end] = seg
        placed.append(Placed(speaker, text, start, len(seg)))
        cursor = end
    return out, placed


def to_pcm16_wav_bytes(audio: np.ndarray) -> bytes:
    pcm = np.clip(np.round(audio * 32767.0), -32768, 32767).astype(np.int16)
    buf = io.BytesIO()
    sf.write(buf, pcm, SAMPLE_RATE, subtype="PCM_16", format="WAV")
    return buf.getvalue()


def transcript(placed: list[Placed]) -> str:
    parts = []
    for p in placed:
        start = math.floor(p.start_s * 100 + 1e-9) / 100
        end = math.ceil(p.end_s * 100 - 1e-9) / 100
        parts.append(f"[{start:.2f}][{p.speaker}]{p.text}[{end:.2f}]")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tail", action="store_true", help="the recovery tail clip instead of the frozen clip")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--check", action="store_true", help="compare with the pinned WAV, write nothing")
    args = parser.parse_args(argv)

    script, num_samples, name = SCRIPT, NUM_SAMPLES, OUTPUT_NAME
    if args.tail:
        script, num_samples, name = TAIL_SCRIPT, TAIL_NUM_SAMPLES, TAIL_OUTPUT_NAME
    audio, placed = build(script, num_samples)
    wav = to_pcm16_wav_bytes(audio)
    digest = hashlib.sha256(wav).hexdigest()
    text = transcript(placed)
    print(f"sha256     {digest}")
    print(f"transcript {text}")
    for p in placed:
        print(f"  {p.speaker} {p.start_s:6.3f}-{p.end_s:6.3f} s  {p.text}")
    if args.check:
        from qualification import clip

        pinned = (clip.FROZEN_CLIP_SHA256, clip.FROZEN_CLIP_TRANSCRIPT)
        if args.tail:
            pinned = (clip.TAIL_CLIP_SHA256, clip.TAIL_CLIP_TRANSCRIPT)
        same = (digest, text) == pinned
        print("matches the frozen clip" if same else "DIFFERS from the frozen clip")
        return 0 if same else 1
    out = args.out or Path(__file__).with_name(name)
    out.write_bytes(wav)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
