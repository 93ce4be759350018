"""The parity rule, known answers on crafted log-probability arrays.

Every engine token is judged against the reference teacher-forced along the
engine's sequence: the reference's top choice, or within the near-tie margin
(log p_top - log p_token, nats). Vocabulary of 4 tokens; the reference's own
greedy run is [0, 1, 2, 3] and ends with EOS (token 3).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from qualification.parity import ForcedStep, compare_runs
from service.settings import QualificationSettings

REFERENCE = [0, 1, 2, 3]
MARGIN = 0.5


def forced_along(rows: list[list[float]], tokens: list[int]) -> list[ForcedStep]:
    """What the teacher-forced reference gives: probabilities per position -> (top, log p_top, log p_token)."""
    logprobs = np.log(np.asarray(rows, dtype=np.float64))
    return [
        ForcedStep(int(row.argmax()), float(row.max()), float(row[token]))
        for row, token in zip(logprobs, tokens, strict=True)
    ]


def judge(candidate, rows=None, *, cand_stop="eos", policy="explainable", margin=MARGIN):
    return compare_runs(
        reference_ids=REFERENCE, reference_stop="eos", candidate_ids=candidate, candidate_stop=cand_stop,
        forced=None if rows is None else forced_along(rows, candidate), policy=policy, margin=margin,
        token_text=lambda t: f"<{t}>",
    )


def test_identical_needs_no_scores() -> None:
    result = judge([0, 1, 2, 3])
    assert (result.verdict, result.passed, result.near_ties, result.first_divergence) == ("identical", True, 0, None)


def test_same_ids_different_stop_fails() -> None:
    result = judge([0, 1, 2, 3], cand_stop="max_tokens")
    assert (result.verdict, result.passed) == ("failed", False)


def test_a_divergence_within_the_margin_is_explained_with_one_near_tie() -> None:
    # Position 1: reference 0.52 on token 1, engine took token 2 at 0.48: gap ln(0.52/0.48) = 0.080 nats.
    # Teacher-forced along the engine's [0, 2, 2, 3], the later positions' top choices are the engine's.
    rows = [[0.9, 0.05, 0.03, 0.02], [0.0, 0.52, 0.48, 0.0], [0.1, 0.1, 0.7, 0.1], [0.1, 0.1, 0.1, 0.7]]
    rows = [[max(p, 1e-6) for p in row] for row in rows]
    result = judge([0, 2, 2, 3], rows)
    assert (result.verdict, result.passed, result.near_ties) == ("explained", True, 1)
    assert result.first_divergence.position == 1
    assert result.first_divergence.reference_top_id == 1
    assert result.largest_margin_used == pytest.approx(math.log(0.52 / 0.48))
    assert result.judged_tokens == 4 and result.first_failure is None


def test_a_later_token_out_of_margin_fails_after_an_explained_divergence() -> None:
    # The divergence at position 1 is a near tie, but at position 2 the engine wrote token 0
    # where the reference (in the engine's own context) gives it 0.2 against 0.6: gap ln 3 = 1.10 > 0.5.
    rows = [[0.9, 0.05, 0.03, 0.02], [0.01, 0.5, 0.48, 0.01], [0.2, 0.1, 0.6, 0.1], [0.1, 0.1, 0.1, 0.7]]
    result = judge([0, 2, 0, 3], rows)
    assert (result.verdict, result.passed) == ("failed", False)
    assert result.first_divergence.position == 1
    assert result.first_failure == 2
    assert result.near_ties == 1  # counted before the failure
    assert "engine token 2" in result.explanation


@pytest.mark.parametrize(("gap", "verdict"), [(MARGIN - 1e-9, "explained"), (MARGIN, "explained"), (MARGIN + 1e-6, "failed")])
def test_the_margin_boundary_is_inclusive(gap: float, verdict: str) -> None:
    forced = [ForcedStep(0, -0.1, -0.1 - gap)]
    result = compare_runs(
        reference_ids=[0], reference_stop="eos", candidate_ids=[1], candidate_stop="eos", forced=forced,
        policy="explainable", margin=MARGIN,
    )
    assert result.verdict == verdict


def test_a_second_choice_sixteen_times_less_likely_is_no_tie() -> None:
    """The old relative rule (2 % of a top logit of 140) called this a near tie; the default margin does not."""
    forced = [ForcedStep(7, math.log(16 / 17), math.log(1 / 17))]
    result = compare_runs(
        reference_ids=[7], reference_stop="eos", candidate_ids=[8], candidate_stop="eos", forced=forced,
        policy="explainable", margin=QualificationSettings().near_tie_logprob_margin,
    )
    assert result.verdict == "failed"
    assert result.first_divergence.reference_margin == pytest.approx(math.log(16))


def test_every_near_tie_is_counted_and_the_largest_kept() -> None:
    rows = [[0.55, 0.45, 1e-6, 1e-6], [0.3, 0.3, 0.4, 1e-6], [1e-6, 0.1, 0.5, 0.4]]
    result = judge([1, 0, 3], rows, cand_stop="eos")
    # gaps: ln(0.55/0.45) = 0.20, ln(0.4/0.3) = 0.29, ln(0.5/0.4) = 0.22: three near ties, all judged.
    assert (result.verdict, result.near_ties, result.judged_tokens) == ("explained", 3, 3)
    assert result.largest_margin_used == pytest.approx(math.log(0.4 / 0.3))


def test_a_divergence_without_scores_fails() -> None:
    result = judge([0, 2, 2, 3], None)
    assert result.verdict == "failed" and "teacher-forced scores cover none" in result.explanation


def test_an_engine_stop_the_reference_cannot_judge_fails() -> None:
    rows = [[0.9, 0.05, 0.03, 0.02], [0.01, 0.5, 0.48, 0.01]]
    result = judge([0, 2], rows, cand_stop="aborted")
    assert result.verdict == "failed" and "aborted" in result.explanation


def test_strict_policy_does_not_pass_an_explained_run() -> None:
    rows = [[0.9, 0.05, 0.03, 0.02], [0.01, 0.5, 0.48, 0.01], [0.1, 0.1, 0.7, 0.1], [0.1, 0.1, 0.1, 0.7]]
    result = judge([0, 2, 2, 3], rows, policy="strict")
    assert (result.verdict, result.passed) == ("explained", False)
