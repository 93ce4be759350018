"""Tokenizer and saved files of the tiny checkpoint."""

from __future__ import annotations

import json
import re

import pytest
from safetensors import safe_open

from qualification.clip import FROZEN_CLIP_TRANSCRIPT

# Written out in full on purpose (moss-contract.md), not imported from the code under test.
CONTRACT_INSTRUCTION = (
    "请将音频转写为文本，每一段需以起始时间戳和说话人编号（[S01]、[S02]、[S03]…）开头，"
    "正文为对应的语音内容，并在段末标注结束时间戳，以清晰标明该段语音范围。"
)
CONTRACT_PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>\n"
    f"{CONTRACT_INSTRUCTION}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>")


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_checkpoint))


def test_every_digit_is_one_token_and_never_merged(tokenizer):
    for digit in "0123456789":
        ids = tokenizer.encode(digit, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids) == [digit]
    text = "[12.34][S05]x9y 2025 ready.[123.40]"
    tokens = tokenizer.convert_ids_to_tokens(tokenizer.encode(text, add_special_tokens=False))
    digits_seen = [t for t in tokens if re.search(r"[0-9]", t)]
    assert digits_seen == [c for c in text if c.isdigit()]
    merged = [t for t in tokenizer.get_vocab() if re.search(r"[0-9]", t) and len(t) > 1 and t not in SPECIALS]
    assert merged == []


def test_special_tokens_are_single_ids(tokenizer):
    ids = [tokenizer.convert_tokens_to_ids(t) for t in SPECIALS]
    assert len(set(ids)) == len(SPECIALS)
    joined = "".join(SPECIALS)
    assert tokenizer.encode(joined, add_special_tokens=False) == ids
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"


def test_chat_template_renders_the_contract_prompt(tokenizer):
    messages = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": CONTRACT_INSTRUCTION}]}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == CONTRACT_PROMPT
    explicit_system = [{"role": "system", "content": "You are a helpful assistant."}] + messages
    assert tokenizer.apply_chat_template(explicit_system, tokenize=False, add_generation_prompt=True) == CONTRACT_PROMPT


def test_processor_prompt_helper_is_the_contract_prompt(hf_reference):
    assert hf_reference.processor.build_prompt() == CONTRACT_PROMPT
    assert hf_reference.processor.build_prompt(
        CONTRACT_INSTRUCTION, hotwords=["MOSS", "vLLM"]
    ) == CONTRACT_PROMPT.replace("。<|im_end|>", "。热词提示：MOSS, vLLM<|im_end|>")


def test_text_round_trips(tokenizer):
    for text in (CONTRACT_PROMPT, FROZEN_CLIP_TRANSCRIPT, "热词提示：Ünïcode ✓ 😀"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_config_files(tiny_checkpoint, tokenizer):
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    assert config["architectures"] == ["MossTranscribeDiarizeForConditionalGeneration"]
    assert config["model_type"] == "moss_transcribe_diarize"
    assert config["auto_map"]["AutoConfig"].startswith("configuration_moss_transcribe_diarize.")
    assert config["auto_map"]["AutoModelForCausalLM"].startswith("modeling_moss_transcribe_diarize.")
    assert config["audio_token_id"] == tokenizer.convert_tokens_to_ids("<|audio_pad|>")
    assert config["audio_merge_size"] == 4 and config["adaptor_input_dim"] == 64 * 4
    assert config["tie_word_embeddings"] is True
    text = config["text_config"]
    assert (text["hidden_size"], text["num_hidden_layers"], text["num_attention_heads"]) == (64, 2, 4)
    assert (text["num_key_value_heads"], text["head_dim"]) == (2, 32)
    assert text["vocab_size"] % 64 == 0 and text["vocab_size"] >= len(tokenizer)
    audio = config["audio_config"]
    assert (audio["d_model"], audio["encoder_layers"], audio["encoder_attention_heads"]) == (64, 2, 4)
    assert (audio["encoder_ffn_dim"], audio["num_mel_bins"], audio["max_source_positions"]) == (128, 80, 1500)

    gen = json.loads((tiny_checkpoint / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    ]
    assert gen["do_sample"] is False

    proc = json.loads((tiny_checkpoint / "processor_config.json").read_text())
    assert proc["auto_map"]["AutoProcessor"] == "processing_moss_transcribe_diarize.MossTranscribeDiarizeProcessor"
    assert (proc["audio_tokens_per_second"], proc["audio_merge_size"]) == (12.5, 4)
    assert (proc["time_marker_every_seconds"], proc["enable_time_marker"]) == (5, True)
    for name in ("configuration", "modeling", "processing"):
        assert (tiny_checkpoint / f"{name}_moss_transcribe_diarize.py").is_file()


def test_tensor_layout_matches_the_upstream_prefixes(tiny_checkpoint):
    with safe_open(str(tiny_checkpoint / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        dtypes = {f.get_slice(n).get_dtype() for n in names}
    assert dtypes == {"F32"}
    assert not any(n.startswith("lm_head") for n in names)  # tied to the embedding
    prefixes = {n.split(".")[1] for n in names}
    assert prefixes == {"whisper_encoder", "vq_adaptor", "language_model"}
    assert all(n.startswith("model.") for n in names)
    adaptor = {n for n in names if n.startswith("model.vq_adaptor.")}
    assert {n.split(".")[3] for n in adaptor} == {"0", "2", "3"}
    assert "model.language_model.embed_tokens.weight" in names
    assert "model.whisper_encoder.embed_positions.weight" in names
    assert "model.language_model.layers.1.self_attn.q_norm.weight" in names
