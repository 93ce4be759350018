"""The parity rule between the serving engine and the Transformers reference.

Greedy, same prompt, same budget. `identical`: the same token IDs and the same
stop. Otherwise every token the engine wrote is judged, not only the first that
differs: the reference is teacher-forced along the engine's sequence (one
forward over prompt + engine tokens gives the reference's log-probabilities at
every position, in the engine's own context), and each engine token must be
the reference's top choice there or within a near-tie margin stated as a
log-probability difference, `log p_top - log p_engine_token <= margin` (a margin
of m admits a token at most e^m times less likely than the top). `explained`
when every token passes and the engine ended the way the reference would judge
(end token or budget); `failed` otherwise, with the first token out of margin.

Why a log-probability difference: it does not grow with the logits' scale (a
tolerance relative to the top logit called a 16x less likely token a tie at GPU
logits of about 140), and it is what BF16 noise moves. The default margin is
calibrated on measured BF16-against-float32 noise (`qualification.calibrate`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

Verdict = Literal["identical", "explained", "failed"]
Policy = Literal["strict", "explainable"]

#: Engine stops the token-by-token judgement covers: an end token is itself a judged token,
#: and a budget stop ends where the reference's budget would. Anything else (aborted, error,
#: context, unknown) is not a decision the reference can explain.
JUDGED_STOPS = frozenset({"eos", "stop_token", "max_tokens"})


@dataclass(frozen=True)
class ForcedStep:
    """The reference at one position of the engine's sequence (teacher-forced), log-probabilities."""

    top_id: int
    top_logprob: float
    token_logprob: float  # of the engine's token at this position

    @property
    def gap(self) -> float:
        """log p_top - log p_engine_token: 0 when the engine took the top choice."""
        return max(0.0, self.top_logprob - self.token_logprob)


@dataclass(frozen=True)
class Divergence:
    """Where the engine's sequence first differs from the reference's own greedy run."""

    position: int
    reference_token_id: int | None
    reference_token: str | None
    candidate_token_id: int | None
    candidate_token: str | None
    #: log p_top - log p_engine_token there, under teacher forcing (None: no scores there).
    reference_margin: float | None
    reference_top_id: int | None


@dataclass(frozen=True)
class ParityResult:
    verdict: Verdict
    policy: Policy
    margin: float
    passed: bool
    reference_stop: str
    candidate_stop: str
    compared_tokens: int
    #: Engine tokens judged against the teacher-forced reference (0 when identical).
    judged_tokens: int
    #: Engine tokens that were not the reference's top choice but within the margin.
    near_ties: int
    #: The largest log-probability gap among the near ties (0.0 without any).
    largest_margin_used: float
    first_divergence: Divergence | None
    #: The first engine token out of margin (None when none was).
    first_failure: int | None
    explanation: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def passes(verdict: Verdict, policy: Policy) -> bool:
    return verdict == "identical" or (verdict == "explained" and policy == "explainable")


def compare_runs(
    *,
    reference_ids: Sequence[int],
    reference_stop: str,
    candidate_ids: Sequence[int],
    candidate_stop: str,
    forced: Sequence[ForcedStep] | None,
    policy: Policy,
    margin: float,
    token_text: Callable[[int], str] = str,
) -> ParityResult:
    """Judge the engine's greedy run against the reference's.

    `forced` holds the reference's teacher-forced scores at each of the engine's
    positions; it is needed only when the sequences differ.
    """
    compared = min(len(reference_ids), len(candidate_ids))

    def result(
        verdict: Verdict,
        explanation: str,
        *,
        divergence: Divergence | None = None,
        judged: int = 0,
        near_ties: int = 0,
        largest: float = 0.0,
        failure: int | None = None,
    ) -> ParityResult:
        return ParityResult(
            verdict=verdict,
            policy=policy,
            margin=margin,
            passed=passes(verdict, policy),
            reference_stop=reference_stop,
            candidate_stop=candidate_stop,
            compared_tokens=compared,
            judged_tokens=judged,
            near_ties=near_ties,
            largest_margin_used=largest,
            first_divergence=divergence,
            first_failure=failure,
            explanation=explanation,
        )

    if list(reference_ids) == list(candidate_ids):
        if reference_stop == candidate_stop:
            return result("identical", f"{len(reference_ids)} token IDs and the stop ({reference_stop}) match")
        return result(
            "failed", f"token IDs match but the stops differ: reference {reference_stop}, engine {candidate_stop}"
        )

    position = next(
        (i for i, (a, b) in enumerate(zip(reference_ids, candidate_ids, strict=False)) if a != b), compared
    )
    ref_id = reference_ids[position] if position < len(reference_ids) else None
    cand_id = candidate_ids[position] if position < len(candidate_ids) else None
    have_scores = forced is not None and len(forced) == len(candidate_ids)
    step = forced[position] if forced is not None and have_scores and position < len(forced) else None
    divergence = Divergence(
        position=position,
        reference_token_id=ref_id,
        reference_token=None if ref_id is None else token_text(ref_id),
        candidate_token_id=cand_id,
        candidate_token=None if cand_id is None else token_text(cand_id),
        reference_margin=None if step is None else step.gap,
        reference_top_id=None if step is None else step.top_id,
    )
    if forced is None or not have_scores:
        scored = "none" if forced is None else str(len(forced))
        return result(
            "failed",
            f"first divergence at token {position}: the reference's teacher-forced scores cover {scored} of the "
            f"engine's {len(candidate_ids)} tokens",
            divergence=divergence,
        )
    if candidate_stop not in JUDGED_STOPS:
        return result(
            "failed",
            f"first divergence at token {position}: the engine stopped with {candidate_stop}, not an end the "
            "reference can judge",
            divergence=divergence,
        )

    near_ties = 0
    largest = 0.0
    for index, (token_id, scores) in enumerate(zip(candidate_ids, forced, strict=True)):
        if int(token_id) == scores.top_id:
            continue
        gap = scores.gap
        if gap > margin:
            return result(
                "failed",
                f"engine token {index} ({token_text(int(token_id))!r}) is {gap:.4g} nats below the reference's top "
                f"choice ({token_text(scores.top_id)!r}), beyond the near-tie margin {margin:.4g} "
                f"(first divergence at token {position}; {near_ties} near ties before it)",
                divergence=divergence,
                judged=index + 1,
                near_ties=near_ties,
                largest=largest,
                failure=index,
            )
        near_ties += 1
        largest = max(largest, gap)
    return result(
        "explained",
        f"first divergence at token {position}; all {len(candidate_ids)} engine tokens are the teacher-forced "
        f"reference's top choice or within {margin:.4g} nats of it ({near_ties} near ties, largest {largest:.4g})",
        divergence=divergence,
        judged=len(candidate_ids),
        near_ties=near_ties,
        largest=largest,
    )
