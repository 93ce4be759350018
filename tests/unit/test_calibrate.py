"""The near-tie calibration's arithmetic, on crafted log-probability arrays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from qualification.calibrate import distribution, flips, pair_gap_noise, suggest_margin, token_noise
from service.settings import QualificationSettings

CALIBRATION = Path(__file__).resolve().parents[2] / "qualification" / "calibration" / "tiny-cpu-bf16.json"


def logprobs(rows: list[list[float]]) -> np.ndarray:
    return np.log(np.asarray(rows, dtype=np.float64))


HIGH = logprobs([[0.6, 0.3, 0.1], [0.5, 0.45, 0.05]])
LOW = logprobs([[0.6, 0.3, 0.1], [0.44, 0.51, 0.05]])  # position 1 flips to token 1


def test_pair_gap_noise_is_the_change_in_each_gap_to_the_top() -> None:
    noise = pair_gap_noise(HIGH, LOW, top_k=3)
    assert noise.shape == (2, 2)
    assert noise[0] == pytest.approx([0.0, 0.0])
    # position 1: gap to token 1 went from ln(0.5/0.45) to ln(0.44/0.51); to token 2 from ln 10 to ln 8.8
    assert noise[1, 0] == pytest.approx(abs(np.log(0.44 / 0.51) - np.log(0.5 / 0.45)))
    assert noise[1, 1] == pytest.approx(abs(np.log(0.44 / 0.05) - np.log(0.5 / 0.05)))


def test_token_noise_and_flips() -> None:
    assert token_noise(HIGH, LOW, top_k=1)[:, 0] == pytest.approx([0.0, abs(np.log(0.44 / 0.5))])
    (flip,) = flips(HIGH, LOW)
    assert (flip["position"], flip["high_top"], flip["low_top"]) == (1, 0, 1)
    assert flip["high_gap"] == pytest.approx(np.log(0.5 / 0.45))


def test_the_margin_is_the_safety_factor_times_the_largest_noise_rounded_up() -> None:
    assert suggest_margin(np.array([0.01, 0.123]), [0.05], safety=2.0) == 0.25
    assert suggest_margin(np.array([0.01]), [0.2], safety=2.0) == 0.4  # a flip across a wider gap counts
    assert suggest_margin(np.zeros((0,)), [], safety=2.0) == 0.0


def test_distribution_quantiles() -> None:
    stats = distribution(np.arange(1001, dtype=np.float64))
    assert (stats["count"], stats["p50"], stats["max"]) == (1001, 500.0, 1000.0)
    assert stats["p99.9"] == pytest.approx(999.0)


def test_the_default_margin_is_the_recorded_calibrations() -> None:
    """The setting's default, the recorded measurement and the derivation rule agree."""
    recorded = json.loads(CALIBRATION.read_text())
    largest = max([recorded["pair_gap_abs_diff"]["max"], *(flip["high_gap"] for flip in recorded["flips"])])
    assert recorded["suggested_margin"] == suggest_margin(np.array([largest]), [], safety=recorded["safety_factor"])
    assert QualificationSettings().near_tie_logprob_margin == recorded["suggested_margin"]
