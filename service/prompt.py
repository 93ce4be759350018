"""The MOSS-Transcribe-Diarize prompt, built exactly as the model's contract says.

The audio span itself (audio tokens plus second markers) is expanded by the
checkpoint's own processor inside the engine; the gateway only writes the text
around the single placeholder.
"""

from __future__ import annotations

from collections.abc import Sequence

AUDIO_PLACEHOLDER = "<|audio_start|><|audio_pad|><|audio_end|>"

DEFAULT_INSTRUCTION = (
    "请将音频转写为文本，每一段需以起始时间戳和说话人编号"
    "（[S01]、[S02]、[S03]…）开头，正文为对应的语音内容，"
    "并在段末标注结束时间戳，以清晰标明该段语音范围。"
)

#: How the model is steered towards hotwords: appended to the instruction.
HOTWORDS_PREFIX = "热词提示："

PROMPT_TEMPLATE = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n" + AUDIO_PLACEHOLDER + "\n{instruction}<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def build_instruction(custom: str | None = None, hotwords: Sequence[str] = ()) -> str:
    """The user instruction: a custom one or the default, plus hotwords if any."""
    instruction = (custom or "").strip() or DEFAULT_INSTRUCTION
    words = [word.strip() for word in hotwords if word.strip()]
    if words:
        instruction = f"{instruction}{HOTWORDS_PREFIX}{', '.join(words)}"
    return instruction


def build_prompt(instruction: str) -> str:
    """The full prompt text with the one audio placeholder."""
    return PROMPT_TEMPLATE.format(instruction=instruction)


def parse_hotwords(raw: str | None) -> list[str]:
    """Hotwords from a form field: comma- or newline-separated (ASCII or full-width comma)."""
    if not raw:
        return []
    for separator in ("，", "\n"):
        raw = raw.replace(separator, ",")
    return [word.strip() for word in raw.split(",") if word.strip()]
