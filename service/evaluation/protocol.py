"""The scoring parameters of one run, written into the report so a number can be re-derived.

A plain frozen dataclass, not a settings model: these are not gateway settings but
the protocol of one evaluation, chosen on the command line and recorded with its
results (the gateway's own settings stay in `service/settings.py`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Protocol:
    collar_s: float = 0.25  # DER/JER no-score zone each side of every gold turn boundary
    window_s: float = 600.0  # gold window length where the manifest gives no cuts (the published 10 minutes)
    bin_s: float = 60.0  # coverage-over-time bin
    bootstrap_samples: int = 1000
    seed: int = 20261130
    confidence: float = 0.95
    max_completion_tokens: int | None = None  # None: the gateway's own budget
