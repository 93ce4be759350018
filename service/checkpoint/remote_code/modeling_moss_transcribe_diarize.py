# Copyright the moss-gateway authors. Apache-2.0.
"""MOSS-Transcribe-Diarize model (clean-room remote code, written from the contract).

Layout (tensor prefixes as in the upstream checkpoint)::

    model.whisper_encoder.*     Whisper encoder (log-mel [chunks, 80, 3000] -> [chunks, 1500, d])
    model.vq_adaptor.layers.0   Linear(d * merge -> hidden)
    model.vq_adaptor.layers.1   SiLU (no weights)
    model.vq_adaptor.layers.2   Linear(hidden -> hidden)
    model.vq_adaptor.layers.3   LayerNorm(hidden, eps=text rms_norm_eps)
    model.language_model.*      Qwen3Model
    lm_head                     tied to model.language_model.embed_tokens

Each 30 s window (chunk) gives ``audio_feature_lengths[i]`` audio tokens; the
first ``audio_feature_lengths[i] * merge`` encoder frames of the chunk are kept,
every ``merge`` consecutive frames are concatenated into one vector, the adaptor
maps it to the decoder width, and the result replaces the ``<|audio_pad|>``
embeddings of the prompt in order (masked scatter).  Audio is only consumed on
the prefill step of ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel, Qwen3Model, WhisperConfig
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast, ModelOutput
from transformers.models.whisper.modeling_whisper import WhisperEncoder, sinusoids

from .configuration_moss_transcribe_diarize import MossTranscribeDiarizeConfig

_AUDIO_INPUT_KEYS = ("input_features", "audio_feature_lengths", "audio_chunk_mapping")


class MossTranscribeDiarizeVQAdaptor(nn.Module):
    """Time-merged encoder frames -> decoder embedding space."""

    def __init__(self, input_dim: int, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_dim, hidden_size, bias=True),
            nn.SiLU(),
            nn.Linear(hidden_size, hidden_size, bias=True),
            nn.LayerNorm(hidden_size, eps=eps, elementwise_affine=True, bias=True),
        )

    def forward(self, merged: torch.Tensor) -> torch.Tensor:
        return self.layers(merged)


class MossTranscribeDiarizePreTrainedModel(PreTrainedModel):
    config_class = MossTranscribeDiarizeConfig
    config: MossTranscribeDiarizeConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    input_modalities = ("audio", "text")
    supports_gradient_checkpointing = True
    _no_split_modules = ["WhisperEncoderLayer", "Qwen3DecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = False

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, WhisperEncoder):
            init.copy_(module.embed_positions.weight, sinusoids(*module.embed_positions.weight.shape))


@dataclass
class MossTranscribeDiarizeModelOutputWithPast(BaseModelOutputWithPast):
    """Decoder output plus the projected audio embeddings that were scattered in."""

    audio_embeds: torch.FloatTensor | None = None


@dataclass
class MossTranscribeDiarizeCausalLMOutputWithPast(ModelOutput):
    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    past_key_values: Cache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    audio_embeds: torch.FloatTensor | None = None


class MossTranscribeDiarizeModel(MossTranscribeDiarizePreTrainedModel):
    """Whisper encoder + adaptor + Qwen3 decoder body (no LM head)."""

    def __init__(self, config: MossTranscribeDiarizeConfig) -> None:
        super().__init__(config)
        audio_config: WhisperConfig = config.audio_config
        text_config = config.text_config
        self.whisper_encoder = WhisperEncoder(audio_config)
        self.vq_adaptor = MossTranscribeDiarizeVQAdaptor(
            input_dim=int(config.adaptor_input_dim),
            hidden_size=int(text_config.hidden_size),
            eps=float(text_config.rms_norm_eps),
        )
        self.language_model = Qwen3Model(text_config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.language_model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.language_model.set_input_embeddings(value)

    def get_audio_features(
        self,
        input_features: torch.Tensor,
        audio_feature_lengths: torch.Tensor,
        audio_chunk_mapping: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Encode log-mel windows and return ``[sum(audio_feature_lengths), hidden]``.

        ``input_features`` is ``[chunks, num_mel_bins, 3000]``; chunks are in prompt
        order (all chunks of the first audio, then the next audio, ...).
        ``audio_chunk_mapping`` (chunk -> audio index) is accepted for interface
        compatibility; ordering is what matters here.
        """
        if input_features.ndim == 2:
            input_features = input_features.unsqueeze(0)
        lengths = torch.as_tensor(audio_feature_lengths, device=input_features.device).reshape(-1).long()
        if lengths.numel() != input_features.shape[0]:
            raise ValueError(
                f"audio_feature_lengths has {lengths.numel()} entries for {input_features.shape[0]} chunks"
            )
        encoder = self.whisper_encoder
        features = input_features.to(dtype=encoder.conv1.weight.dtype, device=encoder.conv1.weight.device)
        hidden = encoder(features).last_hidden_state  # [chunks, frames, d]
        merge = int(self.config.audio_merge_size)
        pieces = []
        for index, n_tokens in enumerate(lengths.tolist()):
            n_frames = int(n_tokens) * merge
            if n_frames > hidden.shape[1]:
                raise ValueError(
                    f"chunk {index} asks for {n_tokens} audio tokens but the encoder gives only "
                    f"{hidden.shape[1] // merge}"
                )
            pieces.append(hidden[index, :n_frames].reshape(int(n_tokens), merge * hidden.shape[-1]))
        merged = torch.cat(pieces, dim=0)
        return self.vq_adaptor(merged)

    def _scatter_audio(
        self,
        input_ids: torch.Tensor,
        inputs_embeds: torch.Tensor,
        audio_embeds: torch.Tensor,
    ) -> torch.Tensor:
        mask = input_ids == int(self.config.audio_token_id)
        n_slots = int(mask.sum().item())
        if n_slots != audio_embeds.shape[0]:
            raise ValueError(
                f"the prompt has {n_slots} <|audio_pad|> tokens but the audio gives {audio_embeds.shape[0]} embeddings"
            )
        mask = mask.unsqueeze(-1).expand_as(inputs_embeds)
        return inputs_embeds.masked_scatter(mask, audio_embeds.to(inputs_embeds.dtype))

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        input_features: torch.FloatTensor | None = None,
        audio_feature_lengths: torch.LongTensor | None = None,
        audio_chunk_mapping: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> MossTranscribeDiarizeModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)

        audio_embeds = None
        if input_features is not None:
            if input_ids is None:
                raise ValueError("audio input needs input_ids to locate the <|audio_pad|> positions")
            if audio_feature_lengths is None:
                raise ValueError("input_features needs audio_feature_lengths")
            audio_embeds = self.get_audio_features(input_features, audio_feature_lengths, audio_chunk_mapping)
            inputs_embeds = self._scatter_audio(input_ids, inputs_embeds, audio_embeds)

        outputs = self.language_model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            **kwargs,
        )
        return MossTranscribeDiarizeModelOutputWithPast(
            last_hidden_state=outputs.last_hidden_state,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            audio_embeds=audio_embeds,
        )


class MossTranscribeDiarizeForConditionalGeneration(MossTranscribeDiarizePreTrainedModel, GenerationMixin):
    """Speech -> diarized transcript, ``[start][Sxx]text[end]`` repeated."""

    _tied_weights_keys = {"lm_head.weight": "model.language_model.embed_tokens.weight"}

    def __init__(self, config: MossTranscribeDiarizeConfig) -> None:
        super().__init__(config)
        self.model = MossTranscribeDiarizeModel(config)
        self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    def get_audio_features(self, input_features, audio_feature_lengths, audio_chunk_mapping=None):
        return self.model.get_audio_features(input_features, audio_feature_lengths, audio_chunk_mapping)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        input_features: torch.FloatTensor | None = None,
        audio_feature_lengths: torch.LongTensor | None = None,
        audio_chunk_mapping: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> MossTranscribeDiarizeCausalLMOutputWithPast:
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            input_features=input_features,
            audio_feature_lengths=audio_feature_lengths,
            audio_chunk_mapping=audio_chunk_mapping,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, keep, :])

        loss = None
        if labels is not None:
            shift_logits = logits[:, :-1, :].float()
            shift_labels = labels[:, 1:].to(shift_logits.device)
            loss = nn.functional.cross_entropy(
                shift_logits.reshape(-1, shift_logits.shape[-1]),
                shift_labels.reshape(-1),
                ignore_index=-100,
            )

        return MossTranscribeDiarizeCausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            audio_embeds=outputs.audio_embeds,
        )

    def prepare_inputs_for_generation(self, input_ids, *args, is_first_iteration: bool | None = False, **kwargs):
        audio_inputs = {key: kwargs.pop(key, None) for key in _AUDIO_INPUT_KEYS}
        model_inputs = super().prepare_inputs_for_generation(
            input_ids, *args, is_first_iteration=is_first_iteration, **kwargs
        )
        # Audio is consumed once, on the prefill step; later steps read the KV cache.
        if is_first_iteration or not kwargs.get("use_cache", True):
            model_inputs.update({k: v for k, v in audio_inputs.items() if v is not None})
        return model_inputs


__all__ = [
    "MossTranscribeDiarizeForConditionalGeneration",
    "MossTranscribeDiarizeModel",
    "MossTranscribeDiarizePreTrainedModel",
]
