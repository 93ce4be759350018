"""A full-size random-weight MOSS-Transcribe-Diarize checkpoint for the GPU benchmark.

The benchmark needs the real model's shapes (0.9B parameters, BF16), not its
weights: speed depends on the shapes alone, and output lengths are forced with
``ignore_eos``. Everything but the sizes and the weights comes from the project's
own fixture code in ``service/checkpoint``: the byte-level BPE tokenizer and its
chat template, the Whisper feature extractor, the processor config with its
``auto_map``, the remote code (configuration, modeling, processing) and the fan-in
initialisation. Nothing is trained.

Two things differ from the tiny checkpoint:

* The vocabulary is the real 151,936 rows. The tokenizer's BPE vocabulary is
  padded with filler entries (``" w512"``, ``" w513"``, ... in the byte-level
  alphabet) that no merge produces, so prompts encode exactly as with the tiny
  tokenizer while every id the model can emit decodes to text.
* The context is 131,072 positions (``max_position_embeddings``), enough for the
  2861.5 s program (about 38k prompt + 36.5k output tokens).

The 1.8 GB of weights cannot travel to the GPU host, so it is built there:
``python -m bench checkpoint --out DIR [--device cuda]`` (a few seconds on a GPU).
``--text-layers`` / ``--audio-layers`` shrink the depth for CPU tests of the builder.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

#: The real architecture (shared/facts/moss-contract.md).
FULL_SIZES: dict[str, Any] = {
    "text": {
        "vocab_size": 151_936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 131_072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
    },
    "audio": {
        "d_model": 1024,
        "encoder_layers": 24,
        "encoder_attention_heads": 16,
        "encoder_ffn_dim": 4096,
        "num_mel_bins": 80,
        "max_source_positions": 1500,
    },
    "audio_merge_size": 4,
    "processor": {
        "audio_tokens_per_second": 12.5,
        "audio_merge_size": 4,
        "time_marker_every_seconds": 5,
        "enable_time_marker": True,
    },
}
SEED = 20261130
BUILD_REPORT = "bench_checkpoint_build.json"
CHECKPOINT_NAME = "moss-transcribe-diarize-fullsize-random"


def _log(message: str) -> None:
    print(f"[bench-checkpoint] {message}", flush=True)


def padded_tokenizer(vocab_size: int) -> Any:
    """The project's tokenizer with its BPE vocabulary padded to ``vocab_size`` ids.

    The filler entries are unreachable by encoding (no merge makes them), so the
    token ids of any prompt are unchanged; they only give every model row a text.
    """
    from tokenizers import Tokenizer

    from service.checkpoint.tokenizer import build_tokenizer, bytes_to_unicode

    base = build_tokenizer()
    data = json.loads(base.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    added = data.get("added_tokens", [])
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError("the base BPE vocabulary is not contiguous")
    # BPE entries first (base, then fillers), the special tokens last, as in Qwen's layout:
    # the tokenizers library numbers added tokens after the model vocabulary anyway.
    first_special = vocab_size - len(added)
    alphabet = bytes_to_unicode()
    for token_id in range(len(vocab), first_special):
        text = "".join(alphabet[b] for b in f" w{token_id}".encode())
        if text in vocab:
            raise ValueError(f"filler token {text!r} collides with the base vocabulary")
        vocab[text] = token_id
    for offset, token in enumerate(added):
        token["id"] = first_special + offset
    tok = Tokenizer.from_str(json.dumps(data, ensure_ascii=False))
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise AssertionError(f"padded tokenizer has {tok.get_vocab_size(with_added_tokens=True)} ids, not {vocab_size}")
    for offset, token in enumerate(added):
        if tok.token_to_id(token["content"]) != first_special + offset:
            raise AssertionError(f"special token {token['content']!r} did not keep id {first_special + offset}")
    for token_id in (0, len(vocab) - 1, first_special - 1, first_special, vocab_size - 1):
        if tok.id_to_token(token_id) is None:
            raise AssertionError(f"id {token_id} has no token")
    return tok


def sizes_with(text_layers: int | None = None, audio_layers: int | None = None) -> dict[str, Any]:
    sizes = json.loads(json.dumps(FULL_SIZES))
    if text_layers is not None:
        sizes["text"]["num_hidden_layers"] = int(text_layers)
    if audio_layers is not None:
        sizes["audio"]["encoder_layers"] = int(audio_layers)
    return sizes


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def build_fullsize_checkpoint(
    out_dir: Path,
    *,
    device: str = "cpu",
    dtype: str = "bfloat16",
    text_layers: int | None = None,
    audio_layers: int | None = None,
    seed: int = SEED,
) -> dict[str, Any]:
    """Write the checkpoint into ``out_dir`` (created; must be empty or absent); return a report."""
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    from service.checkpoint.build import fan_in_init, make_config, write_processor_files
    from service.checkpoint.remote_code.modeling_moss_transcribe_diarize import (
        MossTranscribeDiarizeForConditionalGeneration,
    )
    from service.checkpoint.tokenizer import save_tokenizer

    sizes = sizes_with(text_layers, audio_layers)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty")
    started = time.perf_counter()

    # 1. tokenizer (the project's BPE, padded to the real vocabulary)
    tok = padded_tokenizer(sizes["text"]["vocab_size"])
    special_ids = save_tokenizer(tok, out_dir, model_max_length=sizes["text"]["max_position_embeddings"])
    eos_ids = [special_ids["<|im_end|>"], special_ids["<|endoftext|>"]]
    pad_id = special_ids["<|endoftext|>"]

    # 2. feature extractor, processor config, remote code (the tiny checkpoint's own writer)
    processor = write_processor_files(out_dir, sizes["processor"])
    t_tok = time.perf_counter()

    # 3. model: fan-in initialisation on the target device, no training
    config = make_config(
        sizes, audio_token_id=processor.audio_token_id, eos_ids=eos_ids, pad_id=pad_id, dtype=dtype
    )
    config._attn_implementation = "sdpa"
    torch_dtype = getattr(torch, dtype)
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device(device):
            model = MossTranscribeDiarizeForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous_dtype)
    with torch.device(device):  # random numbers drawn in float32, then stored in `dtype`
        generator = torch.Generator(device=device).manual_seed(seed)
        fan_in_init(model, generator)
    model = model.to(torch_dtype)
    n_params = sum(p.numel() for name, p in model.named_parameters() if name != "lm_head.weight")
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t_init = time.perf_counter()

    # 4. save (lm_head is tied, as in the real checkpoint)
    config.save_pretrained(str(out_dir))
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["auto_map"] = config.auto_map
    cfg["architectures"] = config.architectures
    cfg.pop("_attn_implementation_autoset", None)
    _write_json(out_dir / "config.json", cfg)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "model.safetensors").chmod(0o644)
    weight_bytes = (out_dir / "model.safetensors").stat().st_size
    GenerationConfig(do_sample=False, eos_token_id=eos_ids, pad_token_id=pad_id, bos_token_id=None).save_pretrained(
        str(out_dir)
    )
    (out_dir / "REVISION").write_text(f"{CHECKPOINT_NAME}-seed{seed}\n")
    t_end = time.perf_counter()
    report = {
        "name": CHECKPOINT_NAME,
        "seed": seed,
        "dtype": dtype,
        "device": device,
        "sizes": sizes,
        "parameters": n_params,
        "weight_bytes": weight_bytes,
        "special_token_ids": special_ids,
        "eos_token_ids": eos_ids,
        "audio_token_id": processor.audio_token_id,
        "timings_s": {
            "tokenizer_and_processor": round(t_tok - started, 3),
            "init": round(t_init - t_tok, 3),
            "save": round(t_end - t_init, 3),
            "total": round(t_end - started, 3),
        },
    }
    _write_json(out_dir / BUILD_REPORT, report)
    del model, state
    _log(
        f"built {n_params / 1e9:.3f}B parameters ({weight_bytes / 1e9:.2f} GB, {dtype}) on {device} "
        f"in {t_end - started:.1f} s -> {out_dir}"
    )
    return report


def ensure_fullsize_checkpoint(out_dir: Path, **kwargs: Any) -> Path:
    """Build into ``out_dir`` unless a complete build is already there."""
    out_dir = Path(out_dir)
    if (out_dir / BUILD_REPORT).is_file() and (out_dir / "model.safetensors").is_file():
        _log(f"reusing {out_dir}")
        return out_dir
    if out_dir.exists():
        shutil.rmtree(out_dir)
    build_fullsize_checkpoint(out_dir, **kwargs)
    return out_dir


def kv_bytes_per_token(sizes: dict[str, Any] | None = None, bytes_per_value: int = 2) -> int:
    t = (sizes or FULL_SIZES)["text"]
    return int(t["num_hidden_layers"] * t["num_key_value_heads"] * t["head_dim"] * 2 * bytes_per_value)


def decoder_weight_bytes(sizes: dict[str, Any] | None = None, bytes_per_value: int = 2) -> int:
    """Bytes a decode step reads for the decoder weights (embedding/lm_head counted once)."""
    s = sizes or FULL_SIZES
    t = s["text"]
    h, inter, heads, kv, hd = (
        t["hidden_size"],
        t["intermediate_size"],
        t["num_attention_heads"],
        t["num_key_value_heads"],
        t["head_dim"],
    )
    layer = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter
    return int((t["vocab_size"] * h + t["num_hidden_layers"] * layer) * bytes_per_value)


__all__ = [
    "FULL_SIZES",
    "build_fullsize_checkpoint",
    "ensure_fullsize_checkpoint",
    "kv_bytes_per_token",
    "decoder_weight_bytes",
    "padded_tokenizer",
]
