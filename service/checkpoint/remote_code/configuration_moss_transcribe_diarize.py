# Copyright the moss-gateway authors. Apache-2.0.
"""Configuration for MOSS-Transcribe-Diarize (clean-room remote code).

Written from the project's contract (docs: shared/facts/moss-contract.md):
a Whisper encoder (``audio_config``), a 4x time merge feeding a small MLP
adaptor, and a Qwen3 decoder (``text_config``) whose ``<|audio_pad|>``
embeddings are replaced by the adaptor output.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedConfig, Qwen3Config, WhisperConfig

# Defaults describe the full-size 0.9B model.
_FULL_TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    "tie_word_embeddings": True,
}

_FULL_AUDIO_CONFIG: dict[str, Any] = {
    "num_mel_bins": 80,
    "d_model": 1024,
    "encoder_layers": 24,
    "encoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "max_source_positions": 1500,
    "activation_function": "gelu",
    "scale_embedding": False,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "encoder_layerdrop": 0.0,
}


class MossTranscribeDiarizeConfig(PreTrainedConfig):
    """Composite config: ``text_config`` (Qwen3) + ``audio_config`` (Whisper encoder).

    Args:
        text_config: Qwen3 decoder config (dict or ``Qwen3Config``).
        audio_config: Whisper config, only the encoder fields are used.
        audio_token_id: id of ``<|audio_pad|>``; its embeddings are replaced by audio.
        audio_merge_size: encoder frames merged into one audio token (4).
        adaptor_input_dim: input width of the adaptor, ``d_model * audio_merge_size``.
        tie_word_embeddings: ``lm_head`` shares the token embedding.
    """

    model_type = "moss_transcribe_diarize"
    sub_configs = {"text_config": Qwen3Config, "audio_config": WhisperConfig}
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        text_config: dict[str, Any] | Qwen3Config | None = None,
        audio_config: dict[str, Any] | WhisperConfig | None = None,
        audio_token_id: int = 151671,
        audio_merge_size: int = 4,
        adaptor_input_dim: int | None = None,
        tie_word_embeddings: bool = True,
        initializer_range: float = 0.02,
        **kwargs: Any,
    ) -> None:
        if text_config is None:
            text_config = dict(_FULL_TEXT_CONFIG)
        if isinstance(text_config, dict):
            text_config = {k: v for k, v in text_config.items() if k != "model_type"}
            text_config = Qwen3Config(**text_config)
        if audio_config is None:
            audio_config = dict(_FULL_AUDIO_CONFIG)
        if isinstance(audio_config, dict):
            audio_config = {k: v for k, v in audio_config.items() if k != "model_type"}
            audio_config = WhisperConfig(**audio_config)

        text_config.tie_word_embeddings = bool(tie_word_embeddings)
        if not getattr(text_config, "layer_types", None):
            text_config.layer_types = ["full_attention"] * int(text_config.num_hidden_layers)

        self.text_config = text_config
        self.audio_config = audio_config
        self.audio_token_id = int(audio_token_id)
        self.audio_merge_size = int(audio_merge_size)
        self.adaptor_input_dim = (
            int(adaptor_input_dim)
            if adaptor_input_dim is not None
            else int(audio_config.d_model) * int(audio_merge_size)
        )
        self.initializer_range = float(initializer_range)
        super().__init__(tie_word_embeddings=bool(tie_word_embeddings), **kwargs)

    # Convenience views of the decoder config (generation utilities look here).
    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        return int(self.text_config.vocab_size)

    @vocab_size.setter
    def vocab_size(self, value: int) -> None:
        self.text_config.vocab_size = int(value)

    @property
    def hidden_size(self) -> int:  # type: ignore[override]
        return int(self.text_config.hidden_size)

    @hidden_size.setter
    def hidden_size(self, value: int) -> None:
        self.text_config.hidden_size = int(value)

    @property
    def num_hidden_layers(self) -> int:  # type: ignore[override]
        return int(self.text_config.num_hidden_layers)

    @num_hidden_layers.setter
    def num_hidden_layers(self, value: int) -> None:
        self.text_config.num_hidden_layers = int(value)

    def get_text_config(self, *args: Any, **kwargs: Any) -> Qwen3Config:
        return self.text_config


__all__ = ["MossTranscribeDiarizeConfig"]
