"""The instrumented Transformers reference run.

Loads the checkpoint with its own remote code (`trust_remote_code`), runs greedy
`generate` on the clip with the gateway's exact prompt, and keeps what parity
needs: generated token IDs, the per-step top-2 logits, the effective generation
config, the stop and the timings. Runs as a child process of the gateway
(`python -m qualification.reference ...`), so its memory is returned afterwards.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def reference_identity(model_dir: Path, *, dtype: str, device: str) -> dict[str, Any]:
    """What can change the reference's output (its cache key)."""
    remote = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.glob("*.py"))}
    weights = {
        p.name: f"{p.stat().st_size}:{p.stat().st_mtime_ns}"
        for p in sorted(model_dir.glob("*.safetensors"))
    }
    import torch

    return {
        "transformers": importlib.metadata.version("transformers"),
        "torch": torch.__version__,
        "remote_code_sha256": remote,
        "weights_stat": weights,
        "config_sha256": hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest(),
        "revision": (model_dir / "REVISION").read_text().strip() if (model_dir / "REVISION").is_file() else None,
        "dtype": dtype,
        "device": device,
    }


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
    from transformers import AutoProcessor

    from service.prompt import build_prompt

    torch.manual_seed(0)
    started = time.perf_counter()
    processor = AutoProcessor.from_pretrained(str(model_dir), trust_remote_code=True)
    model = load_generation_model(model_dir, dtype=getattr(torch, dtype))
    model = model.to(device).eval()
    load_s = time.perf_counter() - started

    inputs = processor(text=build_prompt(instruction), audio=[audio.astype(np.float32)], return_tensors="pt")
    inputs = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in inputs.items()}
    if "input_features" in inputs:
        inputs["input_features"] = inputs["input_features"].to(getattr(torch, dtype))
    generation_config = model.generation_config
    eos = generation_config.eos_token_id
    eos_ids = [int(x) for x in (eos if isinstance(eos, list) else [eos]) if x is not None]
    clock = _FirstTokenClock()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    generate_started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=eos_ids,
            output_logits=True,
            return_dict_in_generate=True,
            streamer=clock,
        )
    finished = time.perf_counter()
    prompt_len = int(inputs["input_ids"].shape[1])
    generated = [int(t) for t in out.sequences[0, prompt_len:].tolist()]
    top2: list[list[float]] = []
    for step_logits in out.logits:
        values, ids = torch.topk(step_logits[0].float(), 2)
        top2.append([int(ids[0]), float(values[0]), int(ids[1]), float(values[1])])
    stop = "eos" if generated and generated[-1] in eos_ids else ("max_tokens" if len(generated) >= max_new_tokens else "unknown")
    first = clock.first_token_at or finished
    decode_s = finished - first
    return {
        "identity": reference_identity(model_dir, dtype=dtype, device=device),
        "prompt_ids": [int(t) for t in inputs["input_ids"][0].tolist()],
        "token_ids": generated,
        "text": processor.tokenizer.decode(generated, skip_special_tokens=True),
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
            "load_s": round(load_s, 4),
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
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = run_reference(
        model_dir=args.model,
        audio=np.load(args.audio),
        instruction=args.instruction,
        max_new_tokens=args.max_new_tokens,
        dtype=args.dtype,
        device=args.device,
    )
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
