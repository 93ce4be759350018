"""Issue 18: timestamps checked against the audio, and coverage judged on speech, not time."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from service.evidence import check_timestamps, classify_stop, measure_coverage, truncation_reasons
from service.speech import SpeechPolicy, detect_speech
from service.transcript import Segment, parse_transcript

RATE = 16_000


def tone(seconds: float, level: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (level * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def quiet(seconds: float, noise: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(0)
    return (noise * rng.standard_normal(int(seconds * RATE))).astype(np.float32)


def eos() -> object:
    return classify_stop(
        finish_reason="stop", stop_reason=None, token_ids=[1, 7], eos_token_ids=(7,), max_tokens=100,
        prompt_tokens=10, max_model_len=1000,
    )


def kinds(raw: str, duration: float, tolerance: float = 0.5) -> list[tuple[int, str]]:
    _, anomalies = check_timestamps(parse_transcript(raw).segments, duration, tolerance)
    return [(a.segment, a.kind) for a in anomalies]


def test_a_segment_past_the_end_is_flagged_clamped_and_keeps_its_written_times() -> None:
    segments, anomalies = check_timestamps(parse_transcript("[0.5][S01]a[2.0][600.0][S02]b[602.0]").segments, 40.0, 0.5)
    assert [(a.segment, a.start, a.end, a.kind) for a in anomalies] == [(1, 600.0, 602.0, "past_end")]
    assert (segments[1].start, segments[1].end, segments[1].text) == (40.0, 40.0, "b")
    assert segments[0] == parse_transcript("[0.5][S01]a[2.0]").segments[0]


def test_a_small_overshoot_is_clamped_without_an_anomaly() -> None:
    segments, anomalies = check_timestamps(parse_transcript("[1.0][S01]a[40.3]").segments, 40.0, 0.5)
    assert anomalies == ()
    assert segments[0].end == 40.0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("[5.0][S01]a[3.0]", [(0, "backwards")]),
        ("[2.0][S01]a[2.0]", [(0, "zero_length")]),
        ("[5.0][S01]a[6.0][1.0][S02]b[2.0]", [(1, "out_of_order")]),
        ("[0.0][S01]a[5.0][3.0][S01]b[6.0]", [(1, "overlap")]),
        ("[0.0][S01]a[5.0][3.0][S02]b[6.0]", []),  # two speakers at once: crosstalk, possible
        ("[0.0][S01]a[5.0][4.8][S01]b[6.0]", []),  # within the tolerance
        ("[0.0][S01]a[5.0][600.0][S02]b[602.0][5.5][S01]c[7.0]", [(1, "past_end")]),  # one bad segment does not cascade
    ],
)
def test_impossible_timestamps_are_named(raw: str, expected: list[tuple[int, str]]) -> None:
    assert kinds(raw, 40.0) == expected


def test_the_energy_detector_finds_the_tone_and_ignores_silence_and_faint_noise() -> None:
    audio = np.concatenate([tone(10.0), quiet(10.0), quiet(20.0, noise=0.0003)])
    speech = detect_speech(audio, RATE, SpeechPolicy())
    assert speech.seconds(0.0, 10.0) == pytest.approx(10.0, abs=0.1)
    assert speech.seconds(10.0, 40.0) == pytest.approx(0.0, abs=0.05)  # one frame straddles the edge
    window = speech.window(8.0, 40.0)
    assert window.duration_s == pytest.approx(32.0)
    assert window.seconds(0.0, 2.0) == pytest.approx(2.0, abs=0.1)
    assert window.seconds(2.5, 32.0) == pytest.approx(0.0, abs=0.05)


def test_the_detector_has_a_ceiling_so_a_recording_without_pauses_is_all_speech() -> None:
    speech = detect_speech(tone(20.0, level=0.05), RATE, SpeechPolicy())
    assert speech.speech_s == pytest.approx(20.0, abs=0.1)


def test_a_recording_that_ends_in_silence_is_not_truncated_but_one_that_ends_in_speech_is() -> None:
    transcript = parse_transcript("[0.5][S01]a[4.0][4.5][S02]b[9.6]")
    silent_tail = detect_speech(np.concatenate([tone(10.0), quiet(30.0)]), RATE, SpeechPolicy())
    coverage = measure_coverage(transcript, 40.0, speech=silent_tail)
    assert coverage.uncovered_tail_s == pytest.approx(30.4)
    assert coverage.uncovered_speech_s == pytest.approx(0.4, abs=0.05)
    assert truncation_reasons(eos(), coverage, margin_s=2.0) == []  # type: ignore[arg-type]
    spoken_tail = detect_speech(tone(40.0), RATE, SpeechPolicy())
    coverage = measure_coverage(transcript, 40.0, speech=spoken_tail)
    assert coverage.uncovered_tail_speech_s == pytest.approx(30.4, abs=0.05)
    reasons = truncation_reasons(eos(), coverage, margin_s=2.0)  # type: ignore[arg-type]
    assert len(reasons) == 1 and "30.40 s of speech" in reasons[0]


def test_a_long_inner_gap_with_speech_counts_a_short_pause_does_not() -> None:
    speech = detect_speech(tone(30.0), RATE, SpeechPolicy())
    transcript = parse_transcript("[0.0][S01]a[2.0][2.5][S02]b[10.0][25.0][S01]c[30.0]")
    coverage = measure_coverage(transcript, 30.0, speech=speech, min_gap_s=3.0)
    assert [(s.where, s.start_s, s.end_s) for s in coverage.uncovered] == [("gap", 10.0, 25.0)]
    assert coverage.uncovered_speech_s == pytest.approx(15.0, abs=0.05)
    assert coverage.uncovered_tail_speech_s == 0.0


def test_the_known_case_an_impossible_segment_no_longer_fakes_full_coverage() -> None:
    """Issue 18: clip + 30 s of silence came back with 600.0-602.0 and a zero-length segment."""
    raw = "[0.48][S01]Welcome[1.66][2.10][S02]Ready[9.40][600.0][S01]x[602.0][9.9][S02]y[9.9]"
    segments, anomalies = check_timestamps(parse_transcript(raw).segments, 40.0, 0.5)
    assert [(a.segment, a.kind) for a in anomalies] == [(2, "past_end"), (3, "zero_length")]
    transcript = parse_transcript(raw)
    checked = replace(transcript, segments=segments)
    speech_after = detect_speech(np.concatenate([tone(10.0), tone(30.0)]), RATE, SpeechPolicy())
    coverage = measure_coverage(checked, 40.0, speech=speech_after, anomalies=anomalies)
    assert coverage.last_segment_end_s == 9.4
    assert coverage.coverage == pytest.approx(9.4 / 40.0, abs=1e-4)
    assert coverage.excluded_segments == (2, 3)
    assert truncation_reasons(eos(), coverage, margin_s=2.0)  # type: ignore[arg-type]


def test_without_audio_analysis_every_uncovered_second_counts() -> None:
    coverage = measure_coverage(parse_transcript("[0.0][S01]a[4.0]"), 10.0)
    assert coverage.speech_s is None
    assert coverage.uncovered_speech_s == 6.0


def test_segment_keeps_the_written_end_when_it_ran_backwards() -> None:
    segment = parse_transcript("[5.0][S01]a[3.0]").segments[0]
    assert (segment.start, segment.end, segment.written_end) == (5.0, 5.0, 3.0)
    assert Segment(0, 1.0, 2.0, "S01", "a").written_end is None
