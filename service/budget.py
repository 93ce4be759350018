"""The token budget of a request, computed before anything is generated.

The 47-minute program that came back cut at exactly 16,384 tokens is why this
exists: the budget is derived from the audio's duration and the engine's real
limits, never a fixed number, and a request that cannot fit is refused up front
with the numbers that decided it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from service.errors import ErrorCode, GatewayError


@dataclass(frozen=True)
class BudgetPolicy:
    observed_tokens_per_second: float
    conservative_tokens_per_second: float
    minimum_budget: int


@dataclass(frozen=True)
class EngineLimits:
    max_model_len: int
    encoder_budget_tokens: int
    kv_bytes_per_token_bf16: int


@dataclass(frozen=True)
class TokenBudget:
    """Everything that decided how many tokens a request may generate."""

    duration_s: float
    audio_tokens: int
    prompt_tokens: int
    expected_output_tokens: int
    conservative_output_tokens: int
    context_room: int
    max_tokens: int
    source: str  # "request" or "default"
    fits_conservative: bool
    kv_bytes_bf16: int
    max_model_len: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)  # scalar fields only: no recursive deep copy (asdict)


def audio_token_count(num_samples: int, *, window_samples: int = 480_000, samples_per_token: int = 1280) -> int:
    """Audio embedding tokens: per 30 s window of n samples, (n - 1) // 1280 + 1."""
    total = 0
    for start in range(0, max(num_samples, 0), window_samples):
        chunk = min(window_samples, num_samples - start)
        total += (chunk - 1) // samples_per_token + 1
    return total


def plan_budget(
    *,
    duration_s: float,
    num_samples: int,
    prompt_tokens: int,
    requested_max_tokens: int | None,
    policy: BudgetPolicy,
    limits: EngineLimits,
) -> TokenBudget:
    """Decide the output budget, or refuse the request with the numbers."""
    audio_tokens = audio_token_count(num_samples)
    if audio_tokens > limits.encoder_budget_tokens:
        raise GatewayError(
            ErrorCode.ENCODER_BUDGET_EXCEEDED,
            f"The audio ({duration_s:.2f} s) needs {audio_tokens} audio tokens, more than the engine's encoder "
            f"budget of {limits.encoder_budget_tokens} (max_num_batched_tokens). Send shorter audio or raise "
            f"engine.max_num_batched_tokens.",
            param="file",
        )
    context_room = limits.max_model_len - prompt_tokens
    if context_room < 1:
        raise GatewayError(
            ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            f"The prompt for this audio ({duration_s:.2f} s) is {prompt_tokens} tokens, which leaves no room in "
            f"the engine's context of {limits.max_model_len} tokens.",
            param="file",
        )
    expected = math.ceil(duration_s * policy.observed_tokens_per_second)
    conservative = max(policy.minimum_budget, math.ceil(duration_s * policy.conservative_tokens_per_second))
    if requested_max_tokens is not None:
        if requested_max_tokens > context_room:
            raise GatewayError(
                ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                f"max_completion_tokens={requested_max_tokens} does not fit: the prompt takes {prompt_tokens} of "
                f"the engine's {limits.max_model_len}-token context, leaving {context_room}.",
                param="max_completion_tokens",
            )
        max_tokens, source = requested_max_tokens, "request"
    else:
        if context_room < expected:
            raise GatewayError(
                ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                f"The audio ({duration_s:.2f} s) does not fit the engine's context: its prompt takes "
                f"{prompt_tokens} of {limits.max_model_len} tokens, leaving {context_room} for a transcript "
                f"expected to need about {expected} ({policy.observed_tokens_per_second:g} tokens/s). Send "
                f"shorter audio, raise engine.max_model_len, or set max_completion_tokens explicitly.",
                param="file",
            )
        max_tokens, source = min(conservative, context_room), "default"
    return TokenBudget(
        duration_s=duration_s,
        audio_tokens=audio_tokens,
        prompt_tokens=prompt_tokens,
        expected_output_tokens=expected,
        conservative_output_tokens=conservative,
        context_room=context_room,
        max_tokens=max_tokens,
        source=source,
        fits_conservative=conservative <= context_room,
        kv_bytes_bf16=(prompt_tokens + max_tokens) * limits.kv_bytes_per_token_bf16,
        max_model_len=limits.max_model_len,
    )
