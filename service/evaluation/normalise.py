"""The text normalisation, applied the same way to gold and hypothesis.

The rule (also written into every report as `protocol.normalisation`):

1. MOSS tags are removed: timestamps ``[12.34]`` and speaker tags ``[S01]``
   (they are structure, scored by the timing and diarization metrics, not text);
2. Unicode NFKC, then case folding;
3. apostrophes inside words are deleted (``let's`` -> ``lets``); every other
   punctuation or symbol character (Unicode categories P* and S*) becomes a space;
4. tokens: each CJK character (Han, kana, Hangul) is one token; any other run of
   non-space characters is one token.

WER counts token edits; CER counts character edits over the tokens' characters
with the spaces left out, so a CJK text scores the same by either and a spacing
difference is never a character error.
"""

from __future__ import annotations

import re
import unicodedata

RULE = (
    "remove [mm.ss] timestamps and [Sxx] speaker tags; NFKC; casefold; delete apostrophes; "
    "other punctuation and symbols -> space; CJK characters one token each, other scripts split on spaces; "
    "WER over tokens, CER over the tokens' characters without spaces"
)

_TAG = re.compile(r"\[\s*(?:\d+(?:\.\d*)?|[Ss]\s*\d+)\s*\]")
_APOSTROPHES = "'\u2019\u02bc"
_CJK_RANGES = (
    (0x3040, 0x30FF),  # hiragana, katakana
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xAC00, 0xD7AF),  # Hangul syllables
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0x20000, 0x3134F),  # CJK extensions B-G
)


def is_cjk(char: str) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in _CJK_RANGES)


def words(text: str) -> list[str]:
    """The scoring tokens of `text` (rule above)."""
    text = _TAG.sub(" ", text)
    text = unicodedata.normalize("NFKC", text).casefold()
    for apostrophe in _APOSTROPHES:
        text = text.replace(apostrophe, "")
    cleaned = []
    for char in text:
        category = unicodedata.category(char)
        if category[0] in "PS" or category[0] == "Z" or char.isspace():
            cleaned.append(" ")
        elif is_cjk(char):
            cleaned.append(f" {char} ")
        else:
            cleaned.append(char)
    return "".join(cleaned).split()


def characters(text: str) -> list[str]:
    """The scoring characters of `text`: the tokens' characters, spaces left out."""
    return [char for token in words(text) for char in token]
