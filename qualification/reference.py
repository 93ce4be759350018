"""The instrumented Transformers reference run.

Loads the checkpoint with its own remote code (`trust_remote_code`), builds the
gateway's exact prompt IDs (`service.prompt.PromptBuilder`, the same IDs the
engine receives) with the audio span expanded by the checkpoint's own processor,
and runs greedy `generate`, keeping what parity needs: generated token IDs, the
per-step top-2 logits, the effective generation config, the stop and the
timings. With `--score` it instead teacher-forces the reference along given
token sequences (the engine's) and returns, at every position, the reference's
top choice and log-probabilities (`score_sequences`). Runs as a child process of
the gateway (`python -m qualification.reference ...`), so its memory is returned
afterwards.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from service.prompt import AUDIO_PLACEHOLDER, PromptBuilder

#: This module's source: part of the cached reference's key (its output format and method).
REFERENCE_CODE_PATH = Path(__file__).resolve()


def load_generation_model(model_dir: Path, *, dtype: Any) -> Any:
    """The checkpoint's own remote class named by `architectures` (the one that generates)."""
    from transformers import AutoModelForCausalLM
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    config = json.loads((model_dir / "config.json").read_text())
    architecture = (config.get("architectures") or [None])[0]
    for reference in (config.get("auto_map") or {}).values():
        if isinstance(reference, str) and reference.rsplit(".", 1)[-1] == architecture:
            model_class = get_class_from_dynamic_module(reference, str(model_dir))
            return model_class.from_pretrained(str(model_dir), dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(str(model_dir), trust_remote_code=True, dtype=dtype)


def reference_inputs(processor: Any, audio: np.ndarray, instruction: str) -> dict[str, Any]:
    """Model inputs (numpy) for `audio` with the gateway's prompt IDs.

    The processor sees only the bare placeholder (so no user text reaches its
    tokenizer); its expansion of that placeholder (audio start, pads and time
    markers, audio end) replaces the placeholder in the builder's IDs.
    """
    builder = PromptBuilder(processor.tokenizer)
    encoded = processor(text=AUDIO_PLACEHOLDER, audio=[np.asarray(audio, dtype=np.float32)], return_tensors="np")
    span = [int(token_id) for token_id in encoded["input_ids"][0].tolist()]
    ids = builder.expand(builder.prompt_ids(instruction), span)
    inputs = {key: value for key, value in encoded.items() if key not in ("input_ids", "attention_mask")}
    inputs["input_ids"] = np.asarray([ids], dtype=np.int64)
    inputs["attention_mask"] = np.ones((1, len(ids)), dtype=np.int64)
    return inputs


class ReferenceModel:
    """The checkpoint's model and processor, loaded once, with the clip's inputs ready."""

    def __init__(self, model_dir: Path, *, audio: np.ndarray, instruction: str, dtype: str, device: str) -> None:
        import torch
        from transformers import AutoProcessor

        started = time.perf_counter()
        self.device = device
        self.torch_dtype = getattr(torch, dtype)
        self.processor = AutoProcessor.from_pretrained(str(model_dir), trust_remote_code=True)
        self.model = load_generation_model(model_dir, dtype=self.torch_dtype).to(device).eval()
        self.load_s = time.perf_counter() - started
        inputs = {key: torch.from_numpy(value).to(device) for key, value in reference_inputs(
            self.processor, audio, instruction
        ).items()}
        if "input_features" in inputs:
            inputs["input_features"] = inputs["input_features"].to(self.torch_dtype)
        self.inputs = inputs
        self.prompt_ids = [int(t) for t in inputs["input_ids"][0].tolist()]

    def score(self, tokens: list[int]) -> list[list[float]]:
        """Teacher-forced: `[top_id, top_logprob, token_logprob]` for each of `tokens`, one forward."""
        import torch

        if not tokens:
            return []
        prompt = self.inputs["input_ids"]
        forced = torch.tensor([tokens[:-1]], dtype=prompt.dtype, device=self.device)
        input_ids = torch.cat([prompt, forced], dim=1)
        inputs = {**self.inputs, "input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
        with torch.inference_mode():
            logits = self.model(**inputs, use_cache=False, logits_to_keep=len(tokens)).logits[0]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        top_values, top_ids = logprobs.max(dim=-1)
        chosen = logprobs.gather(1, torch.tensor(tokens, device=logprobs.device).unsqueeze(1)).squeeze(1)
        return [
            [int(i), float(v), float(c)]
            for i, v, c in zip(top_ids.tolist(), top_values.tolist(), chosen.tolist(), strict=True)
        ]


def score_sequences(
    *, model_dir: Path, audio: np.ndarray, instruction: str, sequences: list[list[int]], dtype: str, device: str
) -> dict[str, Any]:
    """The reference teacher-forced along each sequence (the engine's runs that differ from it)."""
    reference = ReferenceModel(model_dir, audio=audio, instruction=instruction, dtype=dtype, device=device)
    started = time.perf_counter()
    scored = [reference.score([int(t) for t in tokens]) for tokens in sequences]
    return {
        "prompt_ids": reference.prompt_ids,
        "scored": scored,
        "timings": {"load_s": round(reference.load_s, 4), "score_s": round(time.perf_counter() - started, 4)},
        "dtype": dtype,
        "device": device,
    }


class _FirstTokenClock:
    """A generate() streamer that notes when the first new token arrives."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_token_at: float | None = None

    def put(self, _value: Any) -> None:
        self.calls += 1
        if self.calls == 2 and self.first_token_at is None:  # call 1 is the prompt
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


def run_reference(
    *,
    model_dir: Path,
    audio: np.ndarray,
    instruction: str,
    max_new_tokens: int,
    dtype: str = "float32",
    device: str = "cpu",
) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    reference = ReferenceModel(model_dir, audio=audio, instruction=instruction, dtype=dtype, device=device)
    model = reference.model
    generation_config = model.generation_config
    eos = generation_config.eos_token_id
    eos_ids = [int(x) for x in (eos if isinstance(eos, list) else [eos]) if x is not None]
    clock = _FirstTokenClock()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    generate_started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            **reference.inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=eos_ids,
            output_logits=True,
            return_dict_in_generate=True,
            streamer=clock,
        )
    finished = time.perf_counter()
    prompt_len = len(reference.prompt_ids)
    generated = [int(t) for t in out.sequences[0, prompt_len:].tolist()]
    top2: list[list[float]] = []
    for step_logits in out.logits:
        values, ids = torch.topk(step_logits[0].float(), 2)
        top2.append([int(ids[0]), float(values[0]), int(ids[1]), float(values[1])])
    stop = "eos" if generated and generated[-1] in eos_ids else ("max_tokens" if len(generated) >= max_new_tokens else "unknown")
    first = clock.first_token_at or finished
    decode_s = finished - first
    return {
        "prompt_ids": reference.prompt_ids,
        "token_ids": generated,
        "text": reference.processor.tokenizer.decode(generated, skip_special_tokens=True),
        "stop": stop,
        "eos_token_ids": eos_ids,
        "top2": top2,
        "generation_config": {
            "max_new_tokens": max_new_tokens,
            "do_sample": False,
            "num_beams": 1,
            "eos_token_id": eos_ids,
            "checkpoint_generation_config": generation_config.to_dict(),
        },
        "timings": {
            "load_s": round(reference.load_s, 4),
            "prefill_s": round(first - generate_started, 4),
            "decode_tokens_per_s": round((len(generated) - 1) / decode_s, 3) if decode_s > 0 and len(generated) > 1 else None,
            "total_s": round(finished - generate_started, 4),
        },
        "memory": {
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "device_peak_bytes": int(torch.cuda.max_memory_allocated()) if device.startswith("cuda") else None,
        },
        "prompt_tokens": prompt_len,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the Transformers reference on one clip.")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--audio", type=Path, required=True, help="float32 .npy of 16 kHz mono samples")
    parser.add_argument("--instruction", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--score", type=Path, help="JSON list of token sequences: teacher-force the reference along each instead"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    audio = np.load(args.audio)
    if args.score is not None:
        result = score_sequences(
            model_dir=args.model, audio=audio, instruction=args.instruction,
            sequences=json.loads(args.score.read_text()), dtype=args.dtype, device=args.device,
        )
    else:
        result = run_reference(
            model_dir=args.model, audio=audio, instruction=args.instruction,
            max_new_tokens=args.max_new_tokens, dtype=args.dtype, device=args.device,
        )
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
