# Copyright the moss-gateway authors. Apache-2.0.
"""Processor for MOSS-Transcribe-Diarize (clean-room remote code, written from the contract).

Audio (16 kHz mono) is cut into 30 s windows; each window of ``n`` samples is
turned into Whisper log-mel features ``[80, 3000]`` (zero-padded) and gives
``(n - 1) // 1280 + 1`` audio tokens (hop 160 x encoder stride 2 x merge 4).

The prompt text carries one ``<|audio_start|><|audio_pad|><|audio_end|>`` per
audio.  The single ``<|audio_pad|>`` is expanded into the *audio span*
(``_audio_span_ids``): one ``<|audio_pad|>`` per audio token, and after every
``int(audio_tokens_per_second * time_marker_every_seconds)`` audio tokens (62
with the saved 12.5 / 5) the decimal digits of the elapsed marker seconds
("5", then "1" "0", ...) as ordinary single-digit tokens.

Prompt-length accounting without running the model
---------------------------------------------------
``count_prompt_tokens(num_samples, instruction)`` gives the exact number of
prompt tokens the engine will see for an audio of ``num_samples`` samples;
``prompt_ids(num_samples, instruction)`` gives the ids themselves.  Both only
tokenize the template; the audio part comes from ``audio_window_token_counts``
and ``_audio_span_ids``.  ``build_prompt(instruction)`` gives the prompt text
(what vLLM receives), ``DEFAULT_INSTRUCTION`` is the contract's default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from transformers import BatchFeature
from transformers.processing_utils import ProcessorMixin

DEFAULT_INSTRUCTION = (
    "请将音频转写为文本，每一段需以起始时间戳和说话人编号（[S01]、[S02]、[S03]…）开头，"
    "正文为对应的语音内容，并在段末标注结束时间戳，以清晰标明该段语音范围。"
)
SYSTEM_PROMPT = "You are a helpful assistant."
HOTWORDS_PREFIX = "热词提示："
WHISPER_ENCODER_STRIDE = 2


class MossTranscribeDiarizeProcessor(ProcessorMixin):
    """Whisper feature extractor + tokenizer + audio-span expansion.

    Attributes used by serving engines: ``feature_extractor``, ``tokenizer``,
    ``audio_merge_size``, ``audio_token`` / ``audio_token_id``,
    ``audio_start_token`` / ``audio_end_token`` and ``_audio_span_ids``.
    """

    def __init__(
        self,
        feature_extractor=None,
        tokenizer=None,
        chat_template: str | None = None,
        audio_tokens_per_second: float = 12.5,
        audio_merge_size: int = 4,
        time_marker_every_seconds: float = 2,
        enable_time_marker: bool = True,
        audio_token: str = "<|audio_pad|>",
        audio_start_token: str = "<|audio_start|>",
        audio_end_token: str = "<|audio_end|>",
        **kwargs: Any,
    ) -> None:
        self.audio_tokens_per_second = float(audio_tokens_per_second)
        self.audio_merge_size = int(audio_merge_size)
        self.time_marker_every_seconds = time_marker_every_seconds
        self.enable_time_marker = bool(enable_time_marker)
        self.audio_token = audio_token
        self.audio_start_token = audio_start_token
        self.audio_end_token = audio_end_token
        super().__init__(feature_extractor, tokenizer, chat_template=chat_template)
        self.audio_token_id = self._single_id(audio_token)
        self.audio_start_token_id = self._single_id(audio_start_token)
        self.audio_end_token_id = self._single_id(audio_end_token)
        self._digit_ids = {d: self._single_id(d) for d in "0123456789"}

    # ------------------------------------------------------------------ ids
    def _single_id(self, token: str) -> int:
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{token!r} must be a single token, got {ids}")
        return int(ids[0])

    @property
    def samples_per_window(self) -> int:
        """Samples in one encoder window (30 s at 16 kHz = 480000)."""
        return int(self.feature_extractor.n_samples)

    @property
    def samples_per_audio_token(self) -> int:
        """hop_length x encoder stride x merge = 1280 samples (80 ms)."""
        return int(self.feature_extractor.hop_length) * WHISPER_ENCODER_STRIDE * self.audio_merge_size

    @property
    def audio_tokens_per_time_marker(self) -> int:
        return int(self.audio_tokens_per_second * float(self.time_marker_every_seconds))

    # ------------------------------------------------------------ counting
    def audio_window_token_counts(self, num_samples: int) -> list[int]:
        """Audio tokens of each 30 s window for ``num_samples`` samples at 16 kHz."""
        num_samples = int(num_samples)
        window, per_token = self.samples_per_window, self.samples_per_audio_token
        return [
            (min(window, num_samples - start) - 1) // per_token + 1 for start in range(0, max(num_samples, 0), window)
        ]

    def count_audio_tokens(self, num_samples: int) -> int:
        """Total ``<|audio_pad|>`` tokens (= audio embeddings) for ``num_samples`` samples."""
        return sum(self.audio_window_token_counts(num_samples))

    def _marker_ids(self, marker_index: int) -> list[int]:
        seconds = marker_index * self.time_marker_every_seconds
        if float(seconds).is_integer():
            text = str(int(seconds))
        else:
            text = f"{seconds:g}"
        return [self._digit_ids[ch] if ch in self._digit_ids else self._single_id(ch) for ch in text]

    def _audio_span_ids(self, num_audio_tokens: int) -> list[int]:
        """Ids that replace the single ``<|audio_pad|>``: pads interleaved with time markers.

        Does not include ``<|audio_start|>`` / ``<|audio_end|>`` (the prompt already has them).
        """
        span: list[int] = []
        period = self.audio_tokens_per_time_marker if self.enable_time_marker else 0
        for index in range(1, int(num_audio_tokens) + 1):
            span.append(self.audio_token_id)
            if period > 0 and index % period == 0:
                span.extend(self._marker_ids(index // period))
        return span

    def audio_span_ids_for_samples(self, num_samples: int) -> list[int]:
        """``<|audio_start|>`` + span + ``<|audio_end|>`` for an audio of ``num_samples`` samples."""
        return [
            self.audio_start_token_id,
            *self._audio_span_ids(self.count_audio_tokens(num_samples)),
            self.audio_end_token_id,
        ]

    # -------------------------------------------------------------- prompt
    @staticmethod
    def build_instruction(instruction: str | None = None, hotwords: Sequence[str] | None = None) -> str:
        """The instruction text: ``instruction`` (default: the contract's Chinese one),
        followed by ``热词提示：w1, w2`` when hotwords are given."""
        text = (instruction or "").strip() or DEFAULT_INSTRUCTION
        words = [w.strip() for w in (hotwords or []) if w and w.strip()]
        if words:
            text = f"{text}{HOTWORDS_PREFIX}{', '.join(words)}"
        return text

    def build_prompt(self, instruction: str | None = None, hotwords: Sequence[str] | None = None) -> str:
        """The full prompt text with one ``<|audio_start|><|audio_pad|><|audio_end|>`` placeholder."""
        question = self.build_instruction(instruction, hotwords)
        return (
            f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
            f"<|im_start|>user\n{self.audio_start_token}{self.audio_token}{self.audio_end_token}\n"
            f"{question}<|im_end|>\n"
            "<|im_start|>assistant\n"
        )

    def _expand_ids(self, ids: Sequence[int], audio_token_counts: Sequence[int]) -> list[int]:
        out: list[int] = []
        counts = list(audio_token_counts)
        used = 0
        for token in ids:
            if token == self.audio_token_id and used < len(counts):
                out.extend(self._audio_span_ids(counts[used]))
                used += 1
            else:
                out.append(int(token))
        if used != len(counts):
            raise ValueError(f"{len(counts)} audio inputs but only {used} {self.audio_token} placeholders in the text")
        return out

    def prompt_ids(
        self, num_samples: int, instruction: str | None = None, hotwords: Sequence[str] | None = None
    ) -> list[int]:
        """Exact prompt token ids for an audio of ``num_samples`` samples (no model, no features)."""
        ids = self.tokenizer.encode(self.build_prompt(instruction, hotwords), add_special_tokens=False)
        return self._expand_ids(ids, [self.count_audio_tokens(num_samples)])

    def count_prompt_tokens(
        self, num_samples: int, instruction: str | None = None, hotwords: Sequence[str] | None = None
    ) -> int:
        """Exact number of prompt tokens for an audio of ``num_samples`` samples."""
        return len(self.prompt_ids(num_samples, instruction, hotwords))

    # ---------------------------------------------------------------- call
    @staticmethod
    def _as_audio_list(audio: Any) -> list[np.ndarray]:
        if audio is None:
            return []
        if isinstance(audio, np.ndarray) or hasattr(audio, "numpy"):
            audio = [audio]
        elif isinstance(audio, tuple) and len(audio) == 2 and isinstance(audio[1], (int, float)):
            audio = [audio]
        items = []
        for item in audio:
            if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], (int, float)):
                item = item[0]
            if hasattr(item, "detach"):
                item = item.detach().cpu().numpy()
            arr = np.asarray(item, dtype=np.float32)
            if arr.ndim == 2 and 1 in arr.shape:
                arr = arr.reshape(-1)
            if arr.ndim != 1:
                raise ValueError(f"audio must be mono 1-D, got shape {arr.shape}")
            if arr.size == 0:
                raise ValueError("audio is empty")
            items.append(arr)
        return items

    def __call__(
        self,
        text: str | list[str] | None = None,
        audio: Any = None,
        sampling_rate: int | None = None,
        return_tensors: str | None = None,
        **kwargs: Any,
    ) -> BatchFeature:
        """Tokenize ``text`` and expand each ``<|audio_pad|>`` for the matching audio (in order).

        Returns ``input_ids``, ``attention_mask`` and, with audio, ``input_features``
        ``[chunks, 80, 3000]``, ``audio_feature_lengths`` ``[chunks]`` (audio tokens per
        window) and ``audio_chunk_mapping`` ``[chunks]`` (window -> audio index).
        """
        if audio is None:
            audio = kwargs.pop("audios", None)
        if sampling_rate is not None and int(sampling_rate) != int(self.feature_extractor.sampling_rate):
            raise ValueError(f"audio must be sampled at {self.feature_extractor.sampling_rate} Hz, got {sampling_rate}")
        audios = self._as_audio_list(audio)

        data: dict[str, Any] = {}
        counts_per_audio: list[int] = []
        if audios:
            windows: list[np.ndarray] = []
            lengths: list[int] = []
            mapping: list[int] = []
            step = self.samples_per_window
            for audio_index, arr in enumerate(audios):
                per_window = self.audio_window_token_counts(arr.shape[0])
                for window_index, n_tokens in enumerate(per_window):
                    windows.append(arr[window_index * step : (window_index + 1) * step])
                    lengths.append(n_tokens)
                    mapping.append(audio_index)
                counts_per_audio.append(sum(per_window))
            features = self.feature_extractor(
                windows,
                sampling_rate=self.feature_extractor.sampling_rate,
                padding="max_length",
                return_tensors="np",
                return_attention_mask=False,
            )["input_features"]
            data["input_features"] = np.asarray(features, dtype=np.float32)
            data["audio_feature_lengths"] = np.asarray(lengths, dtype=np.int64)
            data["audio_chunk_mapping"] = np.asarray(mapping, dtype=np.int64)

        if text is not None:
            texts = [text] if isinstance(text, str) else list(text)
            encoded = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
            n_placeholders = [ids.count(self.audio_token_id) for ids in encoded]
            if audios and sum(n_placeholders) != len(audios):
                raise ValueError(
                    f"{len(audios)} audio inputs but {sum(n_placeholders)} {self.audio_token} placeholders in the text"
                )
            rows: list[list[int]] = []
            cursor = 0
            for ids, n in zip(encoded, n_placeholders, strict=True):
                if audios:
                    rows.append(self._expand_ids(ids, counts_per_audio[cursor : cursor + n]))
                    cursor += n
                else:
                    rows.append(list(ids))
            width = max(len(r) for r in rows)
            pad_id = self.tokenizer.pad_token_id
            if pad_id is None:
                pad_id = self.tokenizer.eos_token_id or 0
            left = getattr(self.tokenizer, "padding_side", "left") == "left"
            input_ids, attention_mask = [], []
            for r in rows:
                pad = [pad_id] * (width - len(r))
                mask = [0] * len(pad)
                input_ids.append(pad + r if left else r + pad)
                attention_mask.append(mask + [1] * len(r) if left else [1] * len(r) + mask)
            data["input_ids"] = np.asarray(input_ids, dtype=np.int64)
            data["attention_mask"] = np.asarray(attention_mask, dtype=np.int64)

        return BatchFeature(data=data, tensor_type=return_tensors)

    @property
    def model_input_names(self) -> list[str]:
        return ["input_ids", "attention_mask", "input_features", "audio_feature_lengths", "audio_chunk_mapping"]

    def batch_decode(self, *args: Any, **kwargs: Any) -> list[str]:
        return self.tokenizer.batch_decode(*args, **kwargs)

    def decode(self, *args: Any, **kwargs: Any) -> str:
        return self.tokenizer.decode(*args, **kwargs)


__all__ = ["MossTranscribeDiarizeProcessor", "DEFAULT_INSTRUCTION", "SYSTEM_PROMPT"]
