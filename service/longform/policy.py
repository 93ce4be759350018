"""How long audio is cut: the policy and its mapping from OpenAI's `chunking_strategy`.

Why a frozen, validated dataclass: the policy is part of the frozen cut plan
and of its hash, so every value must be checked once, at the edge, and never
change afterwards. A bad client value raises `ValueError` naming the field; the
caller turns it into a 400.

Mapping of OpenAI's `server_vad` object (their VAD is a model; ours is an
energy detector, so the mapping is by meaning, not by number):
- `silence_duration_ms` -> `min_silence_s`: the shortest pause a cut may use.
- `prefix_padding_ms` -> `prefix_padding_s`: a cut is placed at least this long
  before the speech that follows its pause (when the pause is long enough), so
  the onset of the next words is never clipped.
- `threshold` (0..1; higher needs louder audio to count as speech) ->
  `activation`: the silence threshold sits that far from the quietest stretch
  of a search window towards its median level, in dB. 0 finds no pause (every
  cut falls back to the quietest point), 1 calls half the window silent, 0.5
  (OpenAI's default) sits midway. A request threshold overrides an absolute
  `threshold_db` configured by the operator.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

_VAD_FIELDS = frozenset({"type", "prefix_padding_ms", "silence_duration_ms", "threshold"})
_MAX_MS = 10_000  # pauses or paddings beyond 10 s are not what a cut needs
#: Longest `chunking_strategy` text accepted: a full server_vad object is under 150 characters.
MAX_STRATEGY_CHARS = 1024
#: Deepest JSON nesting accepted: the server_vad object holds only a string and numbers. Checked
#: before `json.loads`, whose recursion a deeply nested text would exhaust (RecursionError, a 500).
MAX_STRATEGY_DEPTH = 2


@dataclass(frozen=True)
class ChunkingPolicy:
    """Where to cut: near every `target_s`, in a pause found within `search_s` of it.

    `threshold_db` None means adaptive (see `activation`); a number is an absolute
    dBFS level below which a frame is silent. `max_chunk_s` bounds every chunk,
    overlap included.
    """

    target_s: float = 600.0
    overlap_s: float = 10.0
    search_s: float = 30.0
    min_silence_s: float = 0.3
    frame_s: float = 0.03
    threshold_db: float | None = None
    max_chunk_s: float = 900.0
    activation: float = 0.5
    prefix_padding_s: float = 0.3

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None and item.name == "threshold_db":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{item.name} must be a finite number, got {value!r}")
        _check(self.target_s > 0, "target_s", "must be positive")
        _check(self.overlap_s >= 0, "overlap_s", "must not be negative")
        _check(self.search_s >= 0, "search_s", "must not be negative")
        _check(self.min_silence_s >= 0, "min_silence_s", "must not be negative")
        _check(0 < self.frame_s <= 1, "frame_s", "must be in (0, 1]")
        _check(0 <= self.activation <= 1, "activation", "must be in [0, 1]")
        _check(self.prefix_padding_s >= 0, "prefix_padding_s", "must not be negative")
        # Each boundary must land after the previous chunk's overlap, or chunks would nest.
        _check(self.overlap_s + self.search_s < self.target_s, "search_s", "plus overlap_s must be below target_s")
        _check(self.max_chunk_s >= self.target_s + self.overlap_s, "max_chunk_s", "must be >= target_s + overlap_s")

    def as_dict(self) -> dict[str, float | None]:
        """Plain values, for responses, the ledger and the plan hash."""
        return asdict(self)


def from_request(strategy: str | dict[str, Any] | None, *, defaults: ChunkingPolicy) -> ChunkingPolicy | None:
    """Map OpenAI's `chunking_strategy` to a policy; None means the native single pass.

    Accepts "auto", a `server_vad` object, or that object as a JSON string (how a
    multipart form may carry it). Anything else raises ValueError naming the field.
    """
    if strategy is None:
        return None
    if isinstance(strategy, str):
        if len(strategy) > MAX_STRATEGY_CHARS:
            raise ValueError(f"chunking_strategy is {len(strategy)} characters long; at most {MAX_STRATEGY_CHARS}")
        text = strategy.strip()
        if text == "auto":
            return defaults
        if not text.startswith("{"):
            raise ValueError(f"chunking_strategy must be 'auto' or a server_vad object, got {strategy!r}")
        _check_nesting(text)
        try:
            strategy = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"chunking_strategy is not valid JSON: {exc.msg}") from None
    if not isinstance(strategy, dict):
        raise ValueError(f"chunking_strategy must be 'auto' or a server_vad object, got {type(strategy).__name__}")
    kind = strategy.get("type")
    if kind != "server_vad":
        raise ValueError(f"chunking_strategy.type must be 'server_vad', got {kind!r}")
    unknown = sorted(set(strategy) - _VAD_FIELDS)
    if unknown:
        raise ValueError(f"chunking_strategy.{unknown[0]} is not a known field")
    changes: dict[str, Any] = {}
    if "silence_duration_ms" in strategy:
        changes["min_silence_s"] = _ms(strategy["silence_duration_ms"], "silence_duration_ms", minimum=1) / 1000
    if "prefix_padding_ms" in strategy:
        changes["prefix_padding_s"] = _ms(strategy["prefix_padding_ms"], "prefix_padding_ms", minimum=0) / 1000
    if "threshold" in strategy:
        value = strategy["threshold"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ValueError(f"chunking_strategy.threshold must be a number from 0 to 1, got {value!r}")
        changes.update(activation=float(value), threshold_db=None)
    try:
        return replace(defaults, **changes)
    except ValueError as exc:
        raise ValueError(f"chunking_strategy: {exc}") from None


def _check_nesting(text: str) -> None:
    """Refuse JSON text nested deeper than MAX_STRATEGY_DEPTH, without parsing it (brackets in strings do not count)."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
            if depth > MAX_STRATEGY_DEPTH:
                raise ValueError(f"chunking_strategy is nested deeper than {MAX_STRATEGY_DEPTH} levels")
        elif char in "}]":
            depth -= 1


def _ms(value: Any, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"chunking_strategy.{name} must be an integer, got {value!r}")
    if value != int(value) or not minimum <= value <= _MAX_MS:
        raise ValueError(f"chunking_strategy.{name} must be an integer from {minimum} to {_MAX_MS}, got {value!r}")
    return int(value)


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{name} {message}")
