"""Seeded bootstrap confidence intervals and the paired bootstrap test.

Items, not frames or words, are the unit of resampling: the words of one program
are not independent draws, the programs are. A track's figure is the pooled ratio
(sum of errors over sum of totals); each bootstrap replicate draws as many items
as there are, with replacement, from a generator seeded by the report's
`protocol.bootstrap.seed`, so a report is reproducible to the digit.

The paired test compares two systems on the same items (same ids): each
replicate draws one set of item indices and computes both pooled ratios on it,
so item difficulty cancels. The difference is called significant when its
percentile interval excludes 0; the two-sided p-value is twice the smaller
share of replicates on either side of 0 (at most 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.evaluation.metrics import Ratio


@dataclass(frozen=True)
class Bootstrap:
    samples: int = 1000
    seed: int = 20261130
    confidence: float = 0.95

    def _indices(self, n: int) -> np.ndarray:
        return np.random.default_rng(self.seed).integers(0, n, size=(self.samples, n))

    def _bounds(self, values: np.ndarray) -> tuple[float | None, float | None]:
        finite = values[np.isfinite(values)]
        if finite.size == 0:
            return None, None
        tail = (1 - self.confidence) / 2 * 100
        low, high = np.percentile(finite, [tail, 100 - tail])
        return float(low), float(high)

    def interval(self, ratios: Sequence[Ratio]) -> dict[str, float | None]:
        """The pooled ratio of `ratios` and its percentile bootstrap interval."""
        errors = np.array([r.errors for r in ratios], dtype=float)
        totals = np.array([r.total for r in ratios], dtype=float)
        pooled = Ratio(float(errors.sum()), float(totals.sum()))
        if len(ratios) == 0:
            return {"value": None, "ci_low": None, "ci_high": None, "errors": 0.0, "total": 0.0, "n": 0}
        index = self._indices(len(ratios))
        with np.errstate(invalid="ignore", divide="ignore"):
            replicates = errors[index].sum(axis=1) / totals[index].sum(axis=1)
        low, high = self._bounds(replicates)
        return {
            "value": pooled.value,
            "ci_low": low,
            "ci_high": high,
            "errors": pooled.errors,
            "total": pooled.total,
            "n": len(ratios),
        }

    def paired(self, a: Sequence[Ratio], b: Sequence[Ratio]) -> dict[str, float | bool | None]:
        """A minus B on the same items: difference, its interval, p-value and significance."""
        if len(a) != len(b):
            raise ValueError("the paired bootstrap needs the same items on both sides")
        ea, ta = (np.array([r.errors for r in a], dtype=float), np.array([r.total for r in a], dtype=float))
        eb, tb = (np.array([r.errors for r in b], dtype=float), np.array([r.total for r in b], dtype=float))
        value_a, value_b = Ratio(ea.sum(), ta.sum()).value, Ratio(eb.sum(), tb.sum()).value
        if not a or value_a is None or value_b is None:
            return {"a": value_a, "b": value_b, "difference": None, "ci_low": None, "ci_high": None,
                    "p_value": None, "significant": False, "n": len(a)}
        index = self._indices(len(a))
        with np.errstate(invalid="ignore", divide="ignore"):
            diffs = ea[index].sum(axis=1) / ta[index].sum(axis=1) - eb[index].sum(axis=1) / tb[index].sum(axis=1)
        diffs = diffs[np.isfinite(diffs)]
        low, high = self._bounds(diffs)
        p_value = min(1.0, 2 * min(float(np.mean(diffs <= 0)), float(np.mean(diffs >= 0)))) if diffs.size else None
        significant = low is not None and high is not None and (low > 0 or high < 0)
        return {"a": value_a, "b": value_b, "difference": value_a - value_b, "ci_low": low, "ci_high": high,
                "p_value": p_value, "significant": bool(significant), "n": len(a)}
