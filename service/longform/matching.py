"""Scores that tell whether two chunks' segments are the same speech: time and text.

Why words (and single CJK characters) rather than characters: two unrelated
English sentences share many letters in order, so a character-level ratio of
0.3-0.5 means nothing; they share few words. Chinese and Japanese are written
without spaces, so each ideograph or kana is a token of its own.

Why containment as well as the ratio: at a cut one copy is often a clipped
prefix of the other ("and then we" vs "and then we went home"); the plain ratio
calls that 0.7 at best, containment calls it 1.0. Containment is only trusted
from `MIN_CONTAINED_TOKENS` tokens on: one shared word proves nothing.
"""

from __future__ import annotations

import re
import unicodedata
from difflib import SequenceMatcher

#: Shortest token run whose containment in the other copy counts as evidence.
MIN_CONTAINED_TOKENS = 4
#: Timestamps from two generations drift by a few hundred ms; this much slack on
#: each side lets short segments that drifted apart still overlap in time.
TIME_SLACK_S = 0.3

_CJK = "\u2e80-\u2fff\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(f"[{_CJK}]|[^\\W_{_CJK}]+")


def tokens(text: str) -> tuple[str, ...]:
    """Case-folded words; each CJK character is its own token; punctuation is dropped."""
    return tuple(_TOKEN.findall(unicodedata.normalize("NFKC", text).casefold()))


def text_similarity(a: str, b: str) -> float:
    """0..1: how much the two texts are the same words in the same order."""
    left, right = tokens(a), tokens(b)
    if not left or not right:
        return 0.0
    blocks = SequenceMatcher(None, left, right, autojunk=False).get_matching_blocks()
    matched = sum(block.size for block in blocks)
    ratio = 2.0 * matched / (len(left) + len(right))
    shorter = min(len(left), len(right))
    if shorter >= MIN_CONTAINED_TOKENS:
        return max(ratio, matched / shorter)
    return ratio


def overlap_s(a_start: float, a_end: float, b_start: float, b_end: float) -> float:
    """Seconds the two spans share (0 when disjoint)."""
    return max(0.0, min(a_end, b_end) - max(a_start, b_start))


def time_score(a_start: float, a_end: float, b_start: float, b_end: float) -> float:
    """0..1: shared time over the shorter span, both widened by `TIME_SLACK_S`."""
    shared = overlap_s(a_start - TIME_SLACK_S, a_end + TIME_SLACK_S, b_start - TIME_SLACK_S, b_end + TIME_SLACK_S)
    shorter = min(a_end - a_start, b_end - b_start) + 2 * TIME_SLACK_S
    return min(1.0, shared / shorter)
