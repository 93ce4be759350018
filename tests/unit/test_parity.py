"""The parity rule: identical, explained near-ties, failures with the first divergence."""

from __future__ import annotations

from qualification.parity import StepTop2, compare_runs

TOP2 = [StepTop2(10, 5.0, 11, 1.0), StepTop2(20, 3.0, 21, 2.99), StepTop2(30, 4.0, 31, 0.5)]


def run(candidate, *, stop="eos", cand_stop="eos", policy="explainable", tolerance=0.05):
    return compare_runs(
        reference_ids=[10, 20, 30], reference_stop=stop, reference_top2=TOP2,
        candidate_ids=candidate, candidate_stop=cand_stop, policy=policy, tolerance=tolerance,
        token_text=lambda t: f"<{t}>",
    )


def test_identical() -> None:
    result = run([10, 20, 30])
    assert (result.verdict, result.passed, result.first_divergence) == ("identical", True, None)


def test_same_ids_different_stop_fails() -> None:
    result = run([10, 20, 30], cand_stop="max_tokens")
    assert result.verdict == "failed" and not result.passed
    assert "stops differ" in result.explanation


def test_near_tie_second_choice_is_explained() -> None:
    result = run([10, 21, 40])
    assert result.verdict == "explained" and result.passed
    d = result.first_divergence
    assert d is not None
    assert (d.position, d.reference_token_id, d.candidate_token_id) == (1, 20, 21)
    assert (d.reference_token, d.candidate_token) == ("<20>", "<21>")
    assert abs(d.reference_margin - 0.01) < 1e-9
    assert d.candidate_took_second_choice


def test_strict_policy_refuses_explained() -> None:
    result = run([10, 21, 40], policy="strict")
    assert result.verdict == "explained" and not result.passed


def test_wide_margin_divergence_fails() -> None:
    result = run([11, 20, 30])
    assert result.verdict == "failed"
    assert result.first_divergence.position == 0
    assert "not below the tolerance" in result.explanation


def test_non_second_choice_fails_even_on_a_near_tie() -> None:
    result = run([10, 99, 30])
    assert result.verdict == "failed"
    assert "not the reference's second choice" in result.explanation


def test_candidate_stopping_early_fails_at_the_missing_position() -> None:
    result = run([10, 20], cand_stop="eos")
    assert result.verdict == "failed"
    assert result.first_divergence.position == 2
    assert result.first_divergence.candidate_token_id is None


def test_relative_tolerance_explains_a_bf16_tie_at_large_logits() -> None:
    top2 = [StepTop2(1, 138.0, 2, 136.0)]
    kwargs = dict(reference_ids=[1], reference_stop="eos", reference_top2=top2, candidate_ids=[2],
                  candidate_stop="eos", policy="explainable", tolerance=0.05)
    assert compare_runs(**kwargs).verdict == "failed"
    explained = compare_runs(**kwargs, relative_tolerance=0.02)
    assert explained.verdict == "explained" and explained.passed
    assert "2.76" in explained.explanation
    assert compare_runs(**{**kwargs, "reference_top2": [StepTop2(1, 20.0, 2, 18.0)]}, relative_tolerance=0.02).verdict == "failed"
