"""The parity rule between the serving engine and the Transformers reference.

Greedy, same prompt, same budget. `identical`: the same token IDs and the same
stop. Otherwise the first divergence is reported with the reference's top-2
logit margin there; `explained` when that margin is a near-tie (below the
tolerance) and the engine took the reference's second choice, as BF16 against
FP32 can; anything else is `failed`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

Verdict = Literal["identical", "explained", "failed"]
Policy = Literal["strict", "explainable"]


@dataclass(frozen=True)
class StepTop2:
    """The reference's two best tokens at one generation step (raw logits)."""

    top1_id: int
    top1_logit: float
    top2_id: int
    top2_logit: float

    @property
    def margin(self) -> float:
        return self.top1_logit - self.top2_logit


@dataclass(frozen=True)
class Divergence:
    position: int
    reference_token_id: int | None
    reference_token: str | None
    candidate_token_id: int | None
    candidate_token: str | None
    reference_margin: float | None
    reference_second_choice_id: int | None
    candidate_took_second_choice: bool


@dataclass(frozen=True)
class ParityResult:
    verdict: Verdict
    policy: Policy
    tolerance: float
    passed: bool
    reference_stop: str
    candidate_stop: str
    compared_tokens: int
    first_divergence: Divergence | None
    explanation: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def passes(verdict: Verdict, policy: Policy) -> bool:
    return verdict == "identical" or (verdict == "explained" and policy == "explainable")


def compare_runs(
    *,
    reference_ids: Sequence[int],
    reference_stop: str,
    reference_top2: Sequence[StepTop2],
    candidate_ids: Sequence[int],
    candidate_stop: str,
    policy: Policy,
    tolerance: float,
    relative_tolerance: float = 0.0,
    token_text: Callable[[int], str] = str,
) -> ParityResult:
    """Compare two greedy runs.

    A near-tie is a reference margin below `max(tolerance, relative_tolerance * |top-1 logit|)`:
    BF16 resolves a logit of 138 only to steps of 1.0, so an absolute tolerance
    alone cannot call a 2.0 margin there a tie, while at logits near 20 it can.
    """
    def result(verdict: Verdict, divergence: Divergence | None, explanation: str) -> ParityResult:
        return ParityResult(
            verdict=verdict,
            policy=policy,
            tolerance=tolerance,
            passed=passes(verdict, policy),
            reference_stop=reference_stop,
            candidate_stop=candidate_stop,
            compared_tokens=min(len(reference_ids), len(candidate_ids)),
            first_divergence=divergence,
            explanation=explanation,
        )

    if list(reference_ids) == list(candidate_ids):
        if reference_stop == candidate_stop:
            return result("identical", None, f"{len(reference_ids)} token IDs and the stop ({reference_stop}) match")
        return result(
            "failed", None, f"token IDs match but the stops differ: reference {reference_stop}, engine {candidate_stop}"
        )

    position = next(
        (i for i, (a, b) in enumerate(zip(reference_ids, candidate_ids, strict=False)) if a != b),
        min(len(reference_ids), len(candidate_ids)),
    )
    ref_id = reference_ids[position] if position < len(reference_ids) else None
    cand_id = candidate_ids[position] if position < len(candidate_ids) else None
    step = reference_top2[position] if position < len(reference_top2) else None
    took_second = step is not None and cand_id is not None and cand_id == step.top2_id
    divergence = Divergence(
        position=position,
        reference_token_id=ref_id,
        reference_token=None if ref_id is None else token_text(ref_id),
        candidate_token_id=cand_id,
        candidate_token=None if cand_id is None else token_text(cand_id),
        reference_margin=None if step is None else step.margin,
        reference_second_choice_id=None if step is None else step.top2_id,
        candidate_took_second_choice=took_second,
    )
    limit = tolerance if step is None else max(tolerance, relative_tolerance * abs(step.top1_logit))
    if step is not None and took_second and step.margin < limit:
        return result(
            "explained",
            divergence,
            f"first divergence at token {position} is a near-tie: reference margin {step.margin:.3g} < "
            f"{limit:.3g} and the engine took the reference's second choice",
        )
    if cand_id is None or ref_id is None:
        why = "the engine stopped early" if cand_id is None else "the reference stopped early"
    elif step is None:
        why = "no reference logits at that step"
    elif not took_second:
        why = "the engine's token is not the reference's second choice"
    else:
        why = f"reference margin {step.margin:.3g} is not below the tolerance {limit:.3g}"
    return result("failed", divergence, f"first divergence at token {position}: {why}")
