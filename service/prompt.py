"""The MOSS-Transcribe-Diarize prompt, built exactly as the model's contract says.

The prompt is built as token IDs, not as text, because the instruction and the
hotwords are user input: rendered into the template as text, a `<|im_end|>` or
`<|audio_pad|>` written by a client would be read by the tokenizer as the
special token itself and reshape the model's input (end the user turn, add an
audio placeholder). `PromptBuilder` tokenizes the template's own parts with
their special tokens and the user's text so that it can only ever give ordinary
text tokens. The engine, the Transformers reference and prompt-length counting
all take their IDs from it, so the prompt the qualification proved is the one
that serves.

The audio span itself (audio tokens plus second markers) is expanded by the
checkpoint's own processor (inside the engine, or by the reference runner); the
builder writes the single `<|audio_start|><|audio_pad|><|audio_end|>` placeholder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

#: This module's source: it decides the prompt IDs, so it keys the cached reference runs.
PROMPT_CODE_PATH = Path(__file__).resolve()

AUDIO_START = "<|audio_start|>"
AUDIO_PAD = "<|audio_pad|>"
AUDIO_END = "<|audio_end|>"
AUDIO_PLACEHOLDER = AUDIO_START + AUDIO_PAD + AUDIO_END

DEFAULT_INSTRUCTION = (
    "请将音频转写为文本，每一段需以起始时间戳和说话人编号"
    "（[S01]、[S02]、[S03]…）开头，正文为对应的语音内容，"
    "并在段末标注结束时间戳，以清晰标明该段语音范围。"
)

#: How the model is steered towards hotwords: appended to the instruction.
HOTWORDS_PREFIX = "热词提示："

PartKind = Literal["special", "text", "user"]

#: The contract's prompt as parts: special tokens, fixed text, and the one user part
#: ("\n" + instruction, the whole run of text between `<|audio_end|>` and `<|im_end|>`,
#: so its tokens are the ones the tokenizer gives the rendered prompt for benign text).
TEMPLATE_PARTS: tuple[tuple[PartKind, str], ...] = (
    ("special", "<|im_start|>"),
    ("text", "system\nYou are a helpful assistant."),
    ("special", "<|im_end|>"),
    ("text", "\n"),
    ("special", "<|im_start|>"),
    ("text", "user\n"),
    ("special", AUDIO_START),
    ("special", AUDIO_PAD),
    ("special", AUDIO_END),
    ("user", "\n{instruction}"),
    ("special", "<|im_end|>"),
    ("text", "\n"),
    ("special", "<|im_start|>"),
    ("text", "assistant\n"),
)

#: The same prompt as text (for records, the identity and humans).
PROMPT_TEMPLATE = "".join(text for _, text in TEMPLATE_PARTS)

#: Instructions whose prompt IDs a builder keeps (custom instructions: bounded).
PROMPT_MEMO_SIZE = 256


def build_instruction(custom: str | None = None, hotwords: Sequence[str] = ()) -> str:
    """The user instruction: a custom one or the default, plus hotwords if any."""
    instruction = (custom or "").strip() or DEFAULT_INSTRUCTION
    words = [word.strip() for word in hotwords if word.strip()]
    if words:
        instruction = f"{instruction}{HOTWORDS_PREFIX}{', '.join(words)}"
    return instruction


def build_prompt(instruction: str) -> str:
    """The full prompt as text with the one audio placeholder (display only: engines take IDs)."""
    return PROMPT_TEMPLATE.format(instruction=instruction)


def parse_hotwords(raw: str | None) -> list[str]:
    """Hotwords from a form field: comma- or newline-separated (ASCII or full-width comma)."""
    if not raw:
        return []
    for separator in ("，", "\n"):
        raw = raw.replace(separator, ",")
    return [word.strip() for word in raw.split(",") if word.strip()]


class PromptTokenizer(Protocol):
    """The part of a Hugging Face tokenizer the builder uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def get_added_vocab(self) -> Mapping[str, int]: ...


class PromptInjectionError(ValueError):
    """User text still tokenized to a reserved token after escaping (a tokenizer the builder cannot handle)."""


@dataclass(frozen=True)
class AudioPlaceholder:
    """Where the one audio placeholder sits in a prompt-ID list."""

    start_index: int
    ids: tuple[int, int, int]


class PromptBuilder:
    """Prompt token IDs for one tokenizer, with the user's text unable to add special tokens.

    Every added token of the tokenizer (special or not: `<|im_end|>`, `<|audio_pad|>`,
    and in Qwen's vocabulary also the tool and reasoning markers) is reserved: the
    user's text is cut inside each occurrence of one (after its first character) and
    the pieces are tokenized separately, so no piece can match it and it becomes
    ordinary text tokens. Benign text has no cut and tokenizes exactly as the rendered
    prompt does, so the default prompt's IDs do not change. The result is checked:
    user IDs that still contain a reserved ID raise `PromptInjectionError`.
    """

    def __init__(self, tokenizer: PromptTokenizer) -> None:
        self._tokenizer = tokenizer
        added = {str(content): int(token_id) for content, token_id in tokenizer.get_added_vocab().items()}
        self.reserved_texts: tuple[str, ...] = tuple(sorted(added, key=len, reverse=True))
        self.reserved_ids: frozenset[int] = frozenset(added.values())
        self._special_ids: dict[str, int] = {}
        for kind, text in TEMPLATE_PARTS:
            if kind == "special":
                self._special_ids[text] = self._single_reserved_id(text)
        self._fixed_ids: dict[str, list[int]] = {
            text: self._encode_fixed(text) for kind, text in TEMPLATE_PARTS if kind == "text"
        }
        self.placeholder_ids: tuple[int, int, int] = (
            self._special_ids[AUDIO_START],
            self._special_ids[AUDIO_PAD],
            self._special_ids[AUDIO_END],
        )
        self._memo: dict[str, tuple[int, ...]] = {}

    def _single_reserved_id(self, token: str) -> int:
        ids = self._tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1 or int(ids[0]) not in self.reserved_ids:
            raise ValueError(f"the tokenizer has no single added token for {token!r} (got {ids})")
        return int(ids[0])

    def _encode_fixed(self, text: str) -> list[int]:
        ids = [int(token_id) for token_id in self._tokenizer.encode(text, add_special_tokens=False)]
        if self.reserved_ids.intersection(ids):
            raise ValueError(f"the template text {text!r} tokenizes to a reserved token")
        return ids

    def _pieces(self, text: str) -> list[str]:
        """`text` cut after the first character of every occurrence of a reserved token's text."""
        cuts: set[int] = set()
        for reserved in self.reserved_texts:
            at = text.find(reserved)
            while at != -1:
                cuts.add(at + 1)
                at = text.find(reserved, at + 1)
        bounds = [0, *sorted(cuts), len(text)]
        return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]

    def user_text_ids(self, text: str) -> list[int]:
        """Ordinary text tokens for user text, whatever it contains."""
        ids: list[int] = []
        for piece in self._pieces(text):
            ids.extend(int(token_id) for token_id in self._tokenizer.encode(piece, add_special_tokens=False))
        leaked = self.reserved_ids.intersection(ids)
        if leaked:
            raise PromptInjectionError(f"user text still tokenized to reserved tokens {sorted(leaked)}")
        return ids

    def prompt_ids(self, instruction: str) -> list[int]:
        """The whole prompt's IDs with the one audio placeholder (not yet expanded)."""
        cached = self._memo.get(instruction)
        if cached is None:
            ids: list[int] = []
            for kind, text in TEMPLATE_PARTS:
                if kind == "special":
                    ids.append(self._special_ids[text])
                elif kind == "text":
                    ids.extend(self._fixed_ids[text])
                else:
                    ids.extend(self.user_text_ids(text.format(instruction=instruction)))
            if len(self._memo) >= PROMPT_MEMO_SIZE:
                self._memo.clear()
            cached = self._memo[instruction] = tuple(ids)
        return list(cached)

    def placeholder(self, prompt_ids: Sequence[int]) -> AudioPlaceholder:
        """The one audio placeholder of a prompt from `prompt_ids` (raises if there is not exactly one)."""
        pad = self.placeholder_ids[1]
        positions = [index for index, token_id in enumerate(prompt_ids) if token_id == pad]
        if len(positions) != 1:
            raise ValueError(f"a prompt must hold exactly one audio placeholder, found {len(positions)}")
        start = positions[0] - 1
        if tuple(prompt_ids[start : start + 3]) != self.placeholder_ids:
            raise ValueError("the audio placeholder is not <|audio_start|><|audio_pad|><|audio_end|>")
        return AudioPlaceholder(start_index=start, ids=self.placeholder_ids)

    def expand(self, prompt_ids: Sequence[int], audio_span_ids: Sequence[int]) -> list[int]:
        """`prompt_ids` with its placeholder replaced by the expanded span (audio start and end included)."""
        start = self.placeholder(prompt_ids).start_index
        return [*prompt_ids[:start], *audio_span_ids, *prompt_ids[start + 3 :]]

    def template_token_count(self, instruction: str) -> int:
        """Prompt tokens outside the audio span (the placeholder's three are not counted)."""
        return len(self.prompt_ids(instruction)) - len(self.placeholder_ids)
