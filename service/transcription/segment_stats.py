"""Whisper's per-segment numbers (`tokens`, `avg_logprob`, `compression_ratio`, `no_speech_prob`) for MOSS output.

Why these definitions: OpenAI's verbose segment carries them, and clients use
them to judge segments, so each must be a quantity this engine really computed
for this segment, never a constant that only looks measured.
- `tokens`: the generated token IDs whose bytes fall in the segment's raw span
  (its timestamps and speaker tag included), found by aligning the tokens'
  bytes with the raw text.
- `avg_logprob`: the mean log-probability the engine gave those sampled tokens.
- `compression_ratio`: as Whisper defines it, the UTF-8 length of the segment
  text over its zlib-compressed length (high values flag repetition loops).
- `no_speech_prob`: MOSS has no no-speech head. The closest quantity it
  computes is the probability of the end token at the position where the
  segment begins: how likely the model found "nothing more is said" at that
  point. When the end token is not among the top log-probabilities the engine
  returned for that step, the value is the largest it could have been (the
  smaller of the last returned probability and the mass not returned): an
  upper bound, never a guess.
"""

from __future__ import annotations

import bisect
import math
import zlib
from collections.abc import Sequence

from service.transcript import Segment
from service.transcription.job import SegmentStats, TokenLogprob

#: Top log-probabilities asked of the engine per step when segment statistics are needed.
TOP_LOGPROBS = 5


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def end_token_probability(step: dict[int, float], end_token_ids: Sequence[int]) -> float:
    """P(end token) at one step, or its upper bound when the engine did not return it (see module doc)."""
    found = [math.exp(step[token]) for token in end_token_ids if token in step]
    if found:
        return min(1.0, sum(found))
    if not step:
        return 1.0
    probabilities = [math.exp(value) for value in step.values()]
    return max(0.0, min(min(probabilities), 1.0 - sum(probabilities)))


def token_logprobs(
    token_ids: Sequence[int], token_bytes: Sequence[bytes], steps: Sequence[dict[int, float]]
) -> tuple[TokenLogprob, ...]:
    """OpenAI's `logprobs` entries: each sampled token, its bytes and its log-probability."""
    return tuple(
        TokenLogprob(token=data.decode("utf-8", errors="replace"), bytes=list(data), logprob=step.get(token, -math.inf))
        for token, data, step in zip(token_ids, token_bytes, steps, strict=True)
    )


def segment_stats(
    *,
    raw: str,
    segments: Sequence[Segment],
    token_ids: Sequence[int],
    token_bytes: Sequence[bytes],
    steps: Sequence[dict[int, float]],
    end_token_ids: Sequence[int],
    seek: int,
) -> tuple[SegmentStats, ...]:
    """Statistics of each segment from the tokens that wrote it."""
    offsets = [0]
    for data in token_bytes:
        offsets.append(offsets[-1] + len(data))
    byte_at = _byte_offsets(raw, [edge for segment in segments for edge in segment.span])
    stats = []
    for segment in segments:
        first = max(0, bisect.bisect_right(offsets, byte_at[segment.span[0]]) - 1)
        last = max(first + 1, bisect.bisect_left(offsets, byte_at[segment.span[1]]))
        last = min(last, len(token_ids))
        ids = tuple(token_ids[first:last])
        logprobs = [steps[i].get(token_ids[i], -math.inf) for i in range(first, last)]
        stats.append(
            SegmentStats(
                tokens=ids,
                avg_logprob=sum(logprobs) / len(logprobs) if logprobs else 0.0,
                compression_ratio=compression_ratio(segment.text),
                no_speech_prob=end_token_probability(steps[first], end_token_ids) if first < len(steps) else 1.0,
                seek=seek,
            )
        )
    return tuple(stats)


def _byte_offsets(raw: str, positions: list[int]) -> dict[int, int]:
    """UTF-8 byte offset of each character position, in one pass over the text."""
    result: dict[int, int] = {}
    char, byte = 0, 0
    for position in sorted(set(positions)):
        end = min(position, len(raw))
        byte += len(raw[char:end].encode("utf-8"))
        char = end
        result[position] = byte
    return result
