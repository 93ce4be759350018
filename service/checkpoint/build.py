"""Build the tiny MOSS-Transcribe-Diarize checkpoint (real architecture, tiny sizes).

Steps (all deterministic, CPU, float32):

1. tokenizer (``tokenizer.py``): byte-level BPE, 512 tokens, digits single tokens;
2. Whisper feature extractor + processor configs (auto_map -> our remote code);
3. model config (auto_map -> our remote code), fan-in scaled initialisation with the
   final decoder RMSNorm negated (plain N(0, 0.02) makes greedy decoding repeat one token);
4. a short Adam run that teaches the model to write ``FROZEN_CLIP_TRANSCRIPT`` +
   ``<|im_end|>`` for the frozen clip with the default instruction (also for two light
   variants of it, for the clip followed by silence and for the clip followed by the tail
   clip: an early stop with speech left), the tail recovery pass's transcript for the
   audio that pass sees, and only ``<|im_end|>`` for 10 s of silence or of white noise.
   The Whisper encoder stays at its random initialisation (frozen; its outputs are
   computed once), the adaptor and the decoder are trained;
5. a greedy check on the in-memory model, then the files are written.

Entry points: ``build_checkpoint(out_dir)`` here, ``ensure_tiny_checkpoint()`` in
``service/checkpoint/__init__.py`` (cached), ``python -m service.checkpoint build --out DIR``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch
from numpy.typing import NDArray
from safetensors.torch import save_file
from transformers import GenerationConfig, WhisperFeatureExtractor

from qualification.clip import (
    FROZEN_CLIP_PATH,
    FROZEN_CLIP_SEGMENTS,
    FROZEN_CLIP_TRANSCRIPT,
    TAIL_CLIP_PATH,
    TAIL_CLIP_SEGMENTS,
)
from service.checkpoint.remote_code.configuration_moss_transcribe_diarize import MossTranscribeDiarizeConfig
from service.checkpoint.remote_code.modeling_moss_transcribe_diarize import (
    MossTranscribeDiarizeForConditionalGeneration,
)
from service.checkpoint.remote_code.processing_moss_transcribe_diarize import (
    DEFAULT_INSTRUCTION,
    MossTranscribeDiarizeProcessor,
)
from service.checkpoint.tokenizer import build_tokenizer, padded_vocab_size, save_tokenizer
from service.longform.cuts import Cut
from service.settings import CoverageSettings

REMOTE_CODE_DIR = Path(__file__).resolve().parent / "remote_code"
REMOTE_CODE_FILES = (
    "configuration_moss_transcribe_diarize.py",
    "modeling_moss_transcribe_diarize.py",
    "processing_moss_transcribe_diarize.py",
)
ARCHITECTURE = "MossTranscribeDiarizeForConditionalGeneration"
MODEL_TYPE = "moss_transcribe_diarize"

# Sizes (shared/facts/test-checkpoint.md).  Part of the cache key.
SIZES: dict[str, Any] = {
    "text": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,  # vLLM's CPU attention needs head_dim >= 32
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
    },
    "audio": {
        "d_model": 64,
        "encoder_layers": 2,
        "encoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
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
    "train": {
        "seed": 20251130,
        "lr": 4e-3,
        "min_steps": 100,
        "max_steps": 800,
        "check_every": 25,
        "min_margin": 5.0,
        "threads": 1,
    },
}


_LOGGER = logging.getLogger("service.checkpoint")


def _log_default(msg: str) -> None:
    _LOGGER.info("tiny checkpoint: %s", msg)


@contextlib.contextmanager
def _deterministic(threads: int) -> Iterator[None]:
    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(max(1, threads))
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(prev_threads)
        torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)


def make_feature_extractor() -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor(
        feature_size=int(SIZES["audio"]["num_mel_bins"]),
        sampling_rate=16000,
        hop_length=160,
        chunk_length=30,
        n_fft=400,
        padding_value=0.0,
        return_attention_mask=False,
    )


def write_processor_files(out_dir: Path, processor_sizes: dict[str, Any]) -> MossTranscribeDiarizeProcessor:
    """Feature extractor and processor configs plus the remote code, next to a saved tokenizer.

    Shared by every checkpoint the project builds (the tiny one here, the full-size one in bench/),
    so that they all load through the same `auto_map` and the same processor.
    """
    from transformers import PreTrainedTokenizerFast

    fe = make_feature_extractor()
    processor_auto_map = {"AutoProcessor": "processing_moss_transcribe_diarize.MossTranscribeDiarizeProcessor"}
    fe_dict = fe.to_dict()
    fe_dict.pop("mel_filters", None)
    fe_dict["processor_class"] = "MossTranscribeDiarizeProcessor"
    fe_dict["auto_map"] = processor_auto_map
    _write_json(out_dir / "preprocessor_config.json", fe_dict)
    proc_cfg = dict(processor_sizes)
    proc_cfg.update(
        {
            "processor_class": "MossTranscribeDiarizeProcessor",
            "auto_map": processor_auto_map,
            "audio_token": "<|audio_pad|>",
            "audio_start_token": "<|audio_start|>",
            "audio_end_token": "<|audio_end|>",
        }
    )
    _write_json(out_dir / "processor_config.json", proc_cfg)
    for name in REMOTE_CODE_FILES:
        shutil.copyfile(REMOTE_CODE_DIR / name, out_dir / name)
    hf_tok = PreTrainedTokenizerFast.from_pretrained(str(out_dir))
    return MossTranscribeDiarizeProcessor(fe, hf_tok, **processor_sizes)


def make_config(
    sizes: dict[str, Any], *, audio_token_id: int, eos_ids: list[int], pad_id: int, dtype: str = "float32"
) -> MossTranscribeDiarizeConfig:
    """The model config for a size table (the tiny one here, the full-size one in bench/)."""
    t, a = sizes["text"], sizes["audio"]
    text_config = {
        "vocab_size": t["vocab_size"],
        "hidden_size": t["hidden_size"],
        "intermediate_size": t["intermediate_size"],
        "num_hidden_layers": t["num_hidden_layers"],
        "num_attention_heads": t["num_attention_heads"],
        "num_key_value_heads": t["num_key_value_heads"],
        "head_dim": t["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": t["max_position_embeddings"],
        "rms_norm_eps": t["rms_norm_eps"],
        "rope_parameters": {"rope_type": "default", "rope_theta": t["rope_theta"]},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": t["num_hidden_layers"],
        "layer_types": ["full_attention"] * t["num_hidden_layers"],
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": eos_ids[0],
        "pad_token_id": pad_id,
        "dtype": dtype,
    }
    audio_config = {
        "num_mel_bins": a["num_mel_bins"],
        "d_model": a["d_model"],
        "encoder_layers": a["encoder_layers"],
        "encoder_attention_heads": a["encoder_attention_heads"],
        "encoder_ffn_dim": a["encoder_ffn_dim"],
        # the decoder half of WhisperConfig is unused; keep it tiny
        "decoder_layers": 1,
        "decoder_attention_heads": a["encoder_attention_heads"],
        "decoder_ffn_dim": a["encoder_ffn_dim"],
        "max_source_positions": a["max_source_positions"],
        "activation_function": "gelu",
        "scale_embedding": False,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "dtype": dtype,
    }
    config = MossTranscribeDiarizeConfig(
        text_config=text_config,
        audio_config=audio_config,
        audio_token_id=audio_token_id,
        audio_merge_size=sizes["audio_merge_size"],
        tie_word_embeddings=True,
        architectures=[ARCHITECTURE],
        dtype=dtype,
        eos_token_id=eos_ids[0],
        pad_token_id=pad_id,
    )
    config.auto_map = {
        "AutoConfig": "configuration_moss_transcribe_diarize.MossTranscribeDiarizeConfig",
        "AutoModel": "modeling_moss_transcribe_diarize.MossTranscribeDiarizeModel",
        "AutoModelForCausalLM": "modeling_moss_transcribe_diarize.MossTranscribeDiarizeForConditionalGeneration",
    }
    return config


def fan_in_init(model: MossTranscribeDiarizeForConditionalGeneration, generator: torch.Generator) -> None:
    """Embeddings N(0, 1); matrices N(0, 1/fan_in); residual projections (attention out,
    MLP down, encoder out/fc2) x2; biases 0; norms 1; final decoder RMSNorm -1;
    encoder positions sinusoidal.  Random numbers are drawn on the
    generator's device and copied into the parameters."""
    from transformers.models.whisper.modeling_whisper import sinusoids

    with torch.no_grad():
        _fan_in_init(model, generator, sinusoids)


def _fan_in_init(model: Any, generator: Any, sinusoids: Callable[..., Any]) -> None:
    residual_suffixes = (".o_proj.weight", ".down_proj.weight", ".out_proj.weight", ".fc2.weight")
    for name, param in model.named_parameters():
        if name == "lm_head.weight":
            continue  # tied
        if name.endswith("embed_positions.weight"):
            param.copy_(sinusoids(*param.shape))
        elif name.endswith("embed_tokens.weight"):
            param.copy_(torch.randn(param.shape, generator=generator, device=generator.device))
        elif name.endswith(".bias"):
            param.zero_()
        elif param.ndim == 1:  # norm weights
            param.fill_(1.0)
        else:
            fan_in = math.prod(param.shape[1:])
            std = 1.0 / math.sqrt(fan_in)
            if name.endswith(residual_suffixes):
                std *= 2.0
            param.copy_(torch.randn(param.shape, generator=generator, device=generator.device) * std)
    model.model.language_model.norm.weight.fill_(-1.0)
    model.tie_weights()


SAMPLE_RATE = 16_000
#: The silence after the clip in the "silent tail" lesson (the test sends the same).
SILENT_TAIL_S = 3.0


def training_examples(clip: NDArray[np.float32], seed: int) -> list[tuple[np.ndarray, str]]:
    """(audio, transcript) pairs.  The frozen clip comes first (the one that must be
    exact); light variants of it (quieter with a little noise, shifted by 2.5 ms) teach
    the same transcript so that small decoding/resampling differences do not matter;
    silence and white noise teach the empty transcript (``<|im_end|>`` at once); then
    the three inputs of the tail recovery test (`recovery_lessons`)."""
    rng = np.random.default_rng(seed)
    quiet = np.asarray(0.3 * clip + 0.002 * rng.standard_normal(clip.shape[0]), dtype=np.float32)
    shifted = np.concatenate([np.zeros(40, np.float32), clip[:-40]])
    noise = np.asarray(0.05 * rng.standard_normal(clip.shape[0]), dtype=np.float32)
    return [
        (clip, FROZEN_CLIP_TRANSCRIPT),
        (quiet, FROZEN_CLIP_TRANSCRIPT),
        (shifted, FROZEN_CLIP_TRANSCRIPT),
        (np.zeros_like(clip), ""),
        (noise, ""),
        *recovery_lessons(clip, load_clip(TAIL_CLIP_PATH)),
    ]


def recovery_lessons(clip: NDArray[np.float32], tail: NDArray[np.float32]) -> list[tuple[np.ndarray, str]]:
    """The exact audio the gateway's passes see in the tail recovery test, and what to write.

    Why: a checkpoint that knows only its clip writes nothing usable on any other audio,
    so the real engine could not show the three outcomes of an early stop. Taught here:
    the clip then `SILENT_TAIL_S` of silence -> the clip's transcript (complete: the tail
    is silent); the clip then the tail clip -> the clip's transcript and the end token
    (an early stop with speech left, as MOSS does on long programs); and the further
    pass over that audio from the recovery track's frozen cut (`recovery_cut_s`) -> the
    segments it holds, in that pass's own time and speaker labels.
    """
    silent_tail = np.concatenate([clip, np.zeros(int(SILENT_TAIL_S * SAMPLE_RATE), np.float32)])
    early_stop = np.concatenate([clip, tail])
    cut = Cut(1, recovery_cut_s(), round(early_stop.shape[0] / SAMPLE_RATE, 3))
    first, last = cut.sample_span(SAMPLE_RATE)
    return [
        (silent_tail, FROZEN_CLIP_TRANSCRIPT),
        (early_stop, FROZEN_CLIP_TRANSCRIPT),
        (early_stop[first:last], recovery_pass_transcript(cut.start_s, clip.shape[0] / SAMPLE_RATE)),
    ]


def recovery_cut_s() -> float:
    """Where the recovery track cuts after a native pass that wrote the clip's transcript:
    `recovery_back_off_s` (the default) before its last segment ends (RecoveryTrack._recover)."""
    return round(max(0.0, FROZEN_CLIP_SEGMENTS[-1][1] - CoverageSettings().recovery_back_off_s), 3)


def recovery_pass_transcript(cut_s: float, clip_s: float) -> str:
    """The MOSS transcript of [cut_s, end) of the clip then the tail clip: times from the cut,
    speakers numbered in order of first appearance (labels only hold within one generation).
    A segment the cut splits is written whole from 0.00, as the overlap with the native pass."""
    placed = [(max(0.0, a - cut_s), b - cut_s, who, text) for a, b, who, text in FROZEN_CLIP_SEGMENTS if b > cut_s]
    placed += [(a + clip_s - cut_s, b + clip_s - cut_s, who, text) for a, b, who, text in TAIL_CLIP_SEGMENTS]
    labels: dict[str, str] = {}
    for _, _, who, _ in placed:
        labels.setdefault(who, f"S{len(labels) + 1:02d}")
    return "".join(f"[{a:.2f}][{labels[who]}]{text}[{b:.2f}]" for a, b, who, text in placed)


def load_clip(path: Path = FROZEN_CLIP_PATH) -> np.ndarray:
    audio: np.ndarray
    audio, sr = sf.read(str(path), dtype="float32")
    if sr != SAMPLE_RATE or audio.ndim != 1:
        raise ValueError(f"unexpected clip format: {sr} Hz, shape {audio.shape}")
    return audio


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def build_checkpoint(out_dir: Path, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Build the checkpoint into ``out_dir`` (created; must be empty or absent).

    Returns a report dict (timings, token ids, training stats).
    """
    log = log or _log_default
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty")
    train_cfg = SIZES["train"]
    t0 = time.perf_counter()
    report: dict[str, Any] = {}

    with _deterministic(int(train_cfg["threads"])):
        torch.manual_seed(int(train_cfg["seed"]))
        generator = torch.Generator().manual_seed(int(train_cfg["seed"]))

        # 1. tokenizer
        tok = build_tokenizer()
        vocab_size = padded_vocab_size(tok)
        special_ids = save_tokenizer(tok, out_dir, model_max_length=SIZES["text"]["max_position_embeddings"])
        eos_ids = [special_ids["<|im_end|>"], special_ids["<|endoftext|>"]]
        pad_id = special_ids["<|endoftext|>"]

        # 2. feature extractor + processor
        processor = write_processor_files(out_dir, SIZES["processor"])
        hf_tok = processor.tokenizer
        report["tokenizer_size"] = len(hf_tok)
        report["vocab_size"] = vocab_size
        report["special_token_ids"] = special_ids
        report["eos_token_ids"] = eos_ids
        t_tok = time.perf_counter()

        # 3. model
        sizes = {**SIZES, "text": {**SIZES["text"], "vocab_size": vocab_size}}
        config = make_config(sizes, audio_token_id=special_ids["<|audio_pad|>"], eos_ids=eos_ids, pad_id=pad_id)
        config._attn_implementation = "sdpa"
        model = MossTranscribeDiarizeForConditionalGeneration(config).float()
        fan_in_init(model, generator)
        t_init = time.perf_counter()

        # 4. training data
        clip = load_clip()
        prompt_text = processor.build_prompt(DEFAULT_INSTRUCTION)
        examples = training_examples(clip, int(train_cfg["seed"]))
        end_id = special_ids["<|im_end|>"]
        batch = []
        for audio, text in examples:
            enc = processor(text=prompt_text, audio=[audio], return_tensors="pt")
            target = hf_tok.encode(text, add_special_tokens=False) + [end_id]
            batch.append((enc, torch.tensor(target, dtype=torch.long)))
        stats = _train(model, batch, train_cfg, log)
        report["train"] = stats
        t_train = time.perf_counter()

        # 5. greedy check on the in-memory model
        model.eval()
        enc, target = batch[0]
        with torch.no_grad():
            out = model.generate(
                **enc, do_sample=False, max_new_tokens=len(target) + 8, eos_token_id=eos_ids, pad_token_id=pad_id
            )
        new = out[0, enc["input_ids"].shape[1] :].tolist()
        if new != target.tolist():
            raise RuntimeError(
                "tiny checkpoint training did not converge: greedy output "
                f"{hf_tok.decode(new, skip_special_tokens=False)!r}"
            )

        # 6. save
        config.save_pretrained(str(out_dir))
        cfg = json.loads((out_dir / "config.json").read_text())
        cfg["auto_map"] = config.auto_map
        cfg["architectures"] = [ARCHITECTURE]
        cfg.pop("_attn_implementation_autoset", None)
        _write_json(out_dir / "config.json", cfg)
        state = {
            k: v.detach().to(torch.float32).contiguous().clone()
            for k, v in model.state_dict().items()
            if k != "lm_head.weight"
        }
        save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        (out_dir / "model.safetensors").chmod(0o644)
        gen = GenerationConfig(
            do_sample=False,
            eos_token_id=eos_ids,
            pad_token_id=pad_id,
            bos_token_id=None,
        )
        gen.save_pretrained(str(out_dir))
        t_end = time.perf_counter()

    report["timings_s"] = {
        "tokenizer_and_processor": round(t_tok - t0, 3),
        "init": round(t_init - t_tok, 3),
        "train": round(t_train - t_init, 3),
        "check_and_save": round(t_end - t_train, 3),
        "total": round(t_end - t0, 3),
    }
    _write_json(out_dir / "tiny_checkpoint_build.json", report)
    log(f"built in {t_end - t0:.1f} s ({stats['steps']} steps, final loss {stats['final_loss']:.4g})")
    return report


def _train(
    model: MossTranscribeDiarizeForConditionalGeneration,
    batch: list[tuple[Any, torch.Tensor]],
    cfg: dict[str, Any],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Teacher-forced cross entropy on the transcript tokens (all examples in one
    right-padded batch; causal attention keeps padding out of the scored positions).
    The encoder is frozen (its outputs are computed once); adaptor + decoder are
    trained with Adam."""
    inner = model.model
    for p in inner.whisper_encoder.parameters():
        p.requires_grad_(False)
    inner.whisper_encoder.eval()
    audio_token_id = int(model.config.audio_token_id)
    merge = int(model.config.audio_merge_size)

    rows: list[Any] = []
    merged_all: list[Any] = []
    scored: list[Any] = []
    with torch.no_grad():
        for enc, target in batch:
            hidden = inner.whisper_encoder(enc["input_features"].float()).last_hidden_state
            merged_all.extend(
                hidden[i, : int(n) * merge].reshape(int(n), merge * hidden.shape[-1])
                for i, n in enumerate(enc["audio_feature_lengths"].tolist())
            )
            prompt_ids = enc["input_ids"][0]
            rows.append(torch.cat([prompt_ids, target]))
            scored.append((prompt_ids.shape[0], target))
    width = max(r.shape[0] for r in rows)
    pad_id = int(model.config.pad_token_id)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (row, (n_prompt, target)) in enumerate(zip(rows, scored, strict=True)):
        ids[i, : row.shape[0]] = row
        labels[i, n_prompt - 1 : n_prompt - 1 + target.shape[0]] = target  # position t predicts token t+1
    audio_mask = (ids == audio_token_id).unsqueeze(-1)
    merged = torch.cat(merged_all, dim=0)
    flat_labels = labels.reshape(-1)
    scored_positions = flat_labels != -100

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=float(cfg["lr"]), betas=(0.9, 0.98), eps=1e-8)
    max_steps, min_steps = int(cfg["max_steps"]), int(cfg["min_steps"])
    embed = inner.language_model.get_input_embeddings()
    model.train()

    step = 0
    loss_value = float("nan")
    min_margin = float("-inf")
    while step < max_steps:
        lr = float(cfg["lr"]) * min(1.0, (step + 1) / 20)
        for group in opt.param_groups:
            group["lr"] = lr
        emb = embed(ids)
        emb = emb.masked_scatter(audio_mask.expand_as(emb), inner.vq_adaptor(merged))
        hidden = inner.language_model(inputs_embeds=emb, use_cache=False).last_hidden_state
        logits = model.lm_head(hidden).reshape(-1, model.lm_head.out_features)
        logits = logits[scored_positions]
        targets = flat_labels[scored_positions]
        loss = torch.nn.functional.cross_entropy(logits, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        loss_value = float(loss.detach())
        if step % int(cfg["check_every"]) == 0 or step == max_steps:
            with torch.no_grad():
                detached = logits.detach()
                correct = detached.gather(1, targets[:, None])[:, 0]
                others = detached.scatter(1, targets[:, None], float("-inf"))
                min_margin = float((correct - others.max(dim=1).values).min())
            log(f"step {step}: loss {loss_value:.4f}, min teacher-forced margin {min_margin:.2f}")
            if step >= min_steps and min_margin >= float(cfg["min_margin"]):
                break
    model.eval()
    for p in inner.whisper_encoder.parameters():
        p.requires_grad_(True)
    return {"steps": step, "final_loss": loss_value, "min_margin": min_margin}
