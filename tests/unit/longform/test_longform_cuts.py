"""Cut planning: cuts land in pauses, respect the limits, overlap, and hash stably."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.longform.cuts import ChunkingPolicy, CutPlan, from_request, plan_cuts, plan_sha256
from service.longform.levels import FLOOR_DB, frame_levels_db, silence_runs

SR = 16_000
#: Scaled-down policy: one-minute targets keep the arrays small and the tests fast.
SMALL = ChunkingPolicy(target_s=60.0, overlap_s=5.0, search_s=10.0, max_chunk_s=90.0)


def program(duration_s: float, gaps: list[tuple[float, float]], *, seed: int = 0, rate: int = SR) -> np.ndarray:
    """Speech-like tone (syllable envelope, never silent) over a -60 dBFS noise floor, silent in `gaps`."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(duration_s * rate), dtype=np.float64) / rate
    envelope = 0.2 + 0.8 * np.abs(np.sin(2 * np.pi * 2.0 * t))
    voice = 0.3 * envelope * np.sin(2 * np.pi * 220.0 * t)
    for start, end in gaps:
        voice[round(start * rate) : round(end * rate)] = 0.0
    return (voice + 1e-3 * rng.standard_normal(t.shape[0])).astype(np.float32)


def plan(samples: np.ndarray, policy: ChunkingPolicy = SMALL, sha: str = "a" * 64) -> CutPlan:
    return plan_cuts(samples, SR, policy=policy, audio_sha256=sha)


def assert_valid(result: CutPlan) -> None:
    """Invariants every plan must keep: coverage, order, overlap, size limit."""
    cuts, policy = result.cuts, result.policy
    assert cuts[0].start_s == 0.0
    assert cuts[-1].end_s == round(result.duration_s, 3)
    assert [cut.index for cut in cuts] == list(range(len(cuts)))
    for cut in cuts:
        assert 0 < cut.end_s - cut.start_s <= policy.max_chunk_s + 1e-9
    for before, after in zip(cuts, cuts[1:], strict=False):
        assert after.start_s == pytest.approx(before.end_s - policy.overlap_s, abs=1e-9)
        assert after.start_s > before.start_s and after.end_s > before.end_s


def test_cuts_land_inside_the_pauses_not_in_short_breaths() -> None:
    # Real pauses 1 s long near each target; 0.15 s breaths closer to the targets must not be used.
    pauses = [(55.0, 56.0), (117.0, 118.0)]
    breaths = [(59.9, 60.05), (115.9, 116.05)]
    result = plan(program(170.0, pauses + breaths))
    assert_valid(result)
    assert len(result.cuts) == 3
    for boundary, (start, end) in zip(result.boundaries, pauses, strict=True):
        assert boundary.kind == "silence"
        assert start < boundary.at_s < end
        assert boundary.threshold_db is not None and boundary.level_db < boundary.threshold_db
    assert [cut.end_s for cut in result.cuts[:-1]] == [b.at_s for b in result.boundaries]


def test_pauses_shorter_than_min_silence_are_not_pauses() -> None:
    audio = program(100.0, [(57.0, 58.0)])
    strict = from_request({"type": "server_vad", "silence_duration_ms": 1500}, defaults=SMALL)
    assert strict is not None and strict.min_silence_s == 1.5
    assert plan(audio).boundaries[0].kind == "silence"
    fallback = plan(audio, strict).boundaries[0]
    assert fallback.kind == "quietest"  # no 1.5 s pause: the quietest 1.5 s, which holds the 1 s one
    assert 57.0 <= fallback.at_s <= 58.0


def test_the_longest_pause_in_the_window_wins() -> None:
    result = plan(program(100.0, [(58.0, 58.4), (65.0, 66.2)]))
    assert result.boundaries[0].kind == "silence"
    assert 65.0 < result.boundaries[0].at_s < 66.2


def test_a_cut_keeps_the_prefix_padding_before_the_next_speech() -> None:
    audio = program(100.0, [(57.0, 57.6)])
    centred = plan(audio, ChunkingPolicy(**{**SMALL.as_dict(), "prefix_padding_s": 0.0}))
    padded = plan(audio, ChunkingPolicy(**{**SMALL.as_dict(), "prefix_padding_s": 0.5}))
    assert centred.boundaries[0].at_s == pytest.approx(57.3, abs=0.03)
    assert padded.boundaries[0].at_s == pytest.approx(57.1, abs=0.03)
    assert 57.0 <= padded.boundaries[0].at_s <= 57.6 - 0.5 + 0.03


def test_no_silence_still_gives_valid_cuts_at_the_quietest_point() -> None:
    rng = np.random.default_rng(1)
    steady = (0.1 * rng.standard_normal(300 * SR)).astype(np.float32)
    result = plan(steady)
    assert_valid(result)
    assert len(result.cuts) >= 4
    for index, boundary in enumerate(result.boundaries):
        previous = result.boundaries[index - 1].at_s if index else 0.0
        assert boundary.kind == "quietest"
        assert abs(boundary.at_s - (previous + SMALL.target_s)) <= SMALL.search_s


def test_a_chunk_never_exceeds_max_chunk_s_even_at_the_tightest_limit() -> None:
    tight = ChunkingPolicy(target_s=60.0, overlap_s=5.0, search_s=10.0, max_chunk_s=65.0)
    # Pauses only late in each search window: the limit, not the pause, must decide.
    result = plan(program(400.0, [(68.0, 69.0), (131.0, 132.0), (195.0, 196.0)]), tight)
    assert_valid(result)
    assert max(cut.end_s - cut.start_s for cut in result.cuts) <= 65.0
    assert result.boundaries[0].at_s <= 65.0  # the pause at 68 s is in the search window but too late


def test_audio_shorter_than_the_target_is_one_chunk() -> None:
    result = plan(program(42.5, [(20.0, 21.0)]))
    assert [(c.index, c.start_s, c.end_s) for c in result.cuts] == [(0, 0.0, 42.5)]
    assert result.boundaries == ()


def test_empty_audio_is_one_empty_chunk() -> None:
    result = plan(np.zeros(0, dtype=np.float32))
    assert [(c.start_s, c.end_s) for c in result.cuts] == [(0.0, 0.0)]


def test_chunks_overlap_by_overlap_s_before_each_boundary() -> None:
    result = plan(program(170.0, [(55.0, 56.0), (117.0, 118.0)]))
    for boundary, before, after in zip(result.boundaries, result.cuts, result.cuts[1:], strict=False):
        assert before.end_s == boundary.at_s
        assert after.start_s == pytest.approx(boundary.at_s - SMALL.overlap_s, abs=1e-9)
        assert after.sample_span(SR)[0] < before.sample_span(SR)[1]


def test_plan_is_deterministic_and_its_hash_is_stable() -> None:
    audio = program(170.0, [(55.0, 56.0), (117.0, 118.0)])
    first, second = plan(audio), plan(audio.copy())
    assert first == second
    assert first.sha256 == plan_sha256(
        first.cuts, SMALL, duration_s=first.duration_s, sample_rate=SR, audio_sha256="a" * 64
    )
    assert len(first.sha256) == 64 and int(first.sha256, 16) >= 0


def test_hash_changes_with_policy_and_audio_identity() -> None:
    audio = program(170.0, [(55.0, 56.0), (117.0, 118.0)])
    base = plan(audio)
    other_policy = plan(audio, ChunkingPolicy(**{**SMALL.as_dict(), "overlap_s": 4.0}))
    same_cuts_other_knob = plan(audio, ChunkingPolicy(**{**SMALL.as_dict(), "activation": 0.6}))
    other_audio = plan(audio, sha="b" * 64)
    assert same_cuts_other_knob.cuts == base.cuts and other_audio.cuts == base.cuts
    assert len({base.sha256, other_policy.sha256, same_cuts_other_knob.sha256, other_audio.sha256}) == 4


def test_as_dict_is_json_ready_and_complete() -> None:
    result = plan(program(170.0, [(55.0, 56.0), (117.0, 118.0)]))
    data = json.loads(json.dumps(result.as_dict()))
    assert set(data) == {"sha256", "audio_sha256", "sample_rate", "duration_s", "policy", "cuts", "boundaries"}
    assert data["cuts"][0] == {"index": 0, "start_s": 0.0, "end_s": result.cuts[0].end_s}
    assert data["policy"]["target_s"] == 60.0 and data["policy"]["threshold_db"] is None
    assert data["boundaries"][0]["kind"] == "silence"


def test_integer_samples_plan_like_float_samples() -> None:
    audio = program(100.0, [(57.0, 58.0)])
    as_int16 = np.round(audio * 32767).astype(np.int16)
    assert plan(as_int16).cuts == plan(audio).cuts


def test_an_absolute_threshold_below_everything_falls_back_to_the_quietest_point() -> None:
    audio = program(100.0, [(57.0, 58.0)])
    result = plan(audio, ChunkingPolicy(**{**SMALL.as_dict(), "threshold_db": -120.0}))
    assert result.boundaries[0].kind == "quietest"
    assert 57.0 <= result.boundaries[0].at_s <= 58.0


def test_frame_levels_match_known_rms() -> None:
    t = np.arange(SR, dtype=np.float64) / SR
    sine = np.sin(2 * np.pi * 100.0 * t)  # full-scale sine: RMS 1/sqrt(2), -3.01 dBFS
    levels = frame_levels_db(np.concatenate([sine, np.zeros(SR + 100)]), SR, 0.03)
    assert levels.shape == (round((2 * SR + 100) / 480 + 0.5),)
    assert levels[:30] == pytest.approx(-3.0103, abs=0.01)
    assert levels[-1] == FLOOR_DB and levels[40] == FLOOR_DB


def test_silence_runs_keep_only_long_runs() -> None:
    mask = np.array([1, 1, 0, 1, 1, 1, 0, 0, 1], dtype=bool)
    assert silence_runs(mask, 2).tolist() == [[0, 2], [3, 6]]
    assert silence_runs(mask, 3).tolist() == [[3, 6]]


def test_three_hour_program_plans_in_one_pass() -> None:
    # 172.8 M samples; the planner reads them once without copying (see `levels`).
    rng = np.random.default_rng(3)
    period = (0.1 * rng.standard_normal(10 * SR)).astype(np.float32)
    period[round(6.3 * SR) : round(7.0 * SR)] *= 0.01  # a 0.7 s pause every 10 s
    samples = np.tile(period, 3 * 360)
    result = plan_cuts(samples, SR, policy=ChunkingPolicy(), audio_sha256="c" * 64)
    assert_valid(result)
    assert len(result.cuts) == 18
    assert all(b.kind == "silence" and round(b.at_s % 10, 1) in {6.4, 6.5, 6.6, 6.7} for b in result.boundaries)
