"""The frozen qualification clip: pinned bytes, format, transcript, recipe."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest
import soundfile as sf

from qualification.clip import (
    FROZEN_CLIP_NUM_SAMPLES,
    FROZEN_CLIP_PATH,
    FROZEN_CLIP_SEGMENTS,
    FROZEN_CLIP_SHA256,
    FROZEN_CLIP_TRANSCRIPT,
)

SEGMENT_RE = re.compile(r"\[(\d+\.\d{2})\]\[(S\d{2})\]([^\[\]]+)\[(\d+\.\d{2})\]")


def test_wav_bytes_match_the_pinned_sha256():
    assert hashlib.sha256(FROZEN_CLIP_PATH.read_bytes()).hexdigest() == FROZEN_CLIP_SHA256


def test_wav_is_10s_16k_mono_pcm16():
    info = sf.info(str(FROZEN_CLIP_PATH))
    assert (info.samplerate, info.channels, info.frames, info.subtype, info.format) == (
        16000,
        1,
        160000,
        "PCM_16",
        "WAV",
    )
    assert FROZEN_CLIP_NUM_SAMPLES == 160000


def test_transcript_is_moss_format_with_both_speakers():
    segments = SEGMENT_RE.findall(FROZEN_CLIP_TRANSCRIPT)
    assert "".join(f"[{a}][{s}]{t}[{b}]" for a, s, t, b in segments) == FROZEN_CLIP_TRANSCRIPT
    assert 3 <= len(segments) <= 4
    assert {s for _, s, _, _ in segments} == {"S01", "S02"}
    parsed = tuple((float(a), float(b), s, t) for a, s, t, b in segments)
    assert parsed == FROZEN_CLIP_SEGMENTS
    previous_end = 0.0
    for start, end, _, _ in parsed:
        assert previous_end <= start < end <= 10.0
        previous_end = end


def test_speech_sits_inside_the_segments_and_gaps_are_silent(clip_audio):
    audio = clip_audio.astype(np.float64)

    def rms(a: float, b: float) -> float:
        part = audio[int(round(a * 16000)) : int(round(b * 16000))]
        return float(np.sqrt(np.mean(part**2))) if part.size else 0.0

    edges = [0.0]
    for start, end, _, _ in FROZEN_CLIP_SEGMENTS:
        assert rms(start, end) > 0.05
        edges += [start, end]
    edges.append(10.0)
    for a, b in zip(edges[0::2], edges[1::2], strict=True):  # the gaps between segments
        assert rms(a + 0.01, b - 0.01) < 1e-3, (a, b)


def test_recipe_regenerates_the_frozen_clip():
    from qualification.clip import make_clip

    if make_clip.espeak_version() != make_clip.PINNED_ESPEAK_VERSION:
        pytest.skip(f"needs espeak-ng {make_clip.PINNED_ESPEAK_VERSION}, found {make_clip.espeak_version()}")
    audio, placed = make_clip.build()
    assert hashlib.sha256(make_clip.to_pcm16_wav_bytes(audio)).hexdigest() == FROZEN_CLIP_SHA256
    assert make_clip.transcript(placed) == FROZEN_CLIP_TRANSCRIPT


def test_tail_clip_is_pinned_8s_16k_mono_pcm16_with_the_same_voices():
    from qualification.clip import TAIL_CLIP_NUM_SAMPLES, TAIL_CLIP_PATH, TAIL_CLIP_SHA256

    assert hashlib.sha256(TAIL_CLIP_PATH.read_bytes()).hexdigest() == TAIL_CLIP_SHA256
    info = sf.info(str(TAIL_CLIP_PATH))
    assert (info.samplerate, info.channels, info.frames, info.subtype) == (16000, 1, TAIL_CLIP_NUM_SAMPLES, "PCM_16")


def test_tail_clip_transcript_matches_its_segments_and_audio():
    from qualification.clip import TAIL_CLIP_PATH, TAIL_CLIP_SEGMENTS, TAIL_CLIP_TRANSCRIPT

    segments = SEGMENT_RE.findall(TAIL_CLIP_TRANSCRIPT)
    assert tuple((float(a), float(b), s, t) for a, s, t, b in segments) == TAIL_CLIP_SEGMENTS
    assert not {t for *_, t in TAIL_CLIP_SEGMENTS} & {t for *_, t in FROZEN_CLIP_SEGMENTS}  # other words
    audio, _ = sf.read(str(TAIL_CLIP_PATH), dtype="float64")
    for start, end, _, _ in TAIL_CLIP_SEGMENTS:
        assert float(np.sqrt(np.mean(audio[int(start * 16000) : int(end * 16000)] ** 2))) > 0.05


def test_recipe_regenerates_the_tail_clip():
    from qualification.clip import TAIL_CLIP_SHA256, TAIL_CLIP_TRANSCRIPT, make_clip

    if make_clip.espeak_version() != make_clip.PINNED_ESPEAK_VERSION:
        pytest.skip(f"needs espeak-ng {make_clip.PINNED_ESPEAK_VERSION}, found {make_clip.espeak_version()}")
    audio, placed = make_clip.build(make_clip.TAIL_SCRIPT, make_clip.TAIL_NUM_SAMPLES)
    assert hashlib.sha256(make_clip.to_pcm16_wav_bytes(audio)).hexdigest() == TAIL_CLIP_SHA256
    assert make_clip.transcript(placed) == TAIL_CLIP_TRANSCRIPT
