"""Calibrate parity's near-tie margin on measured BF16-against-float32 noise.

The parity rule lets an engine token pass when the teacher-forced reference
rates it at most `margin` nats below its top choice. That margin must cover
what numerical precision alone moves, and no more. This tool measures it: the
reference runs greedy in float32 on the clip and on the batch companions (by
default for the whole budget, the end token held off, so that the less certain
positions after the transcript are measured too), then the same token sequences are teacher-forced through the
reference in float32 and in a low precision (bfloat16), and at every position
it compares the log-probabilities of float32's top-k tokens:

* `token`: |log p_low(t) - log p_32(t)| for each of those tokens;
* `pair_gap`: |(log p_low(top) - log p_low(t)) - (log p_32(top) - log p_32(t))|, the
  noise in the gap between the top choice and a contender: the low-precision run
  prefers a contender exactly when this exceeds the float32 gap, so it is the
  quantity the margin must cover;
* the positions where the low-precision argmax differs, with their float32 gaps.

The suggested margin is `SAFETY_FACTOR` times the largest pair-gap noise seen
(rounded up to 0.01 nats): the serving engine differs from the reference in
kernels as well as precision. Run it on the hardware and checkpoint you serve:

    python -m qualification.calibrate --model DIR --device cuda --out calibration.json

With no `--model`, the embedded tiny checkpoint is used (CPU numbers; see README).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

from qualification.clip import FROZEN_CLIP_PATH
from qualification.reference import ReferenceModel
from qualification.runner import batch_companions, load_clip
from service.checkpoint import ensure_tiny_checkpoint
from service.identity import checkpoint_identity, runtime_identity
from service.prompt import build_instruction

#: Contenders compared with the top choice at each position (float32's top-k, top included).
TOP_K = 8
#: Margin = this times the largest measured pair-gap noise: the serving engine's BF16 kernels differ from the
#: reference's in accumulation order and fusion too, so half as much again as the worst BF16 movement seen.
SAFETY_FACTOR = 1.5


def pair_gap_noise(high: np.ndarray, low: np.ndarray, top_k: int = TOP_K) -> np.ndarray:
    """Per position and contender: |gap_low - gap_high| for the high-precision run's top-k tokens.

    `high`, `low`: log-probabilities `[positions, vocab]`. Returns `[positions, top_k - 1]`.
    """
    order = np.argsort(-high, axis=1, kind="stable")[:, :top_k]
    top = order[:, :1]
    contenders = order[:, 1:]
    gap_high = np.take_along_axis(high, top, 1) - np.take_along_axis(high, contenders, 1)
    gap_low = np.take_along_axis(low, top, 1) - np.take_along_axis(low, contenders, 1)
    return np.abs(gap_low - gap_high)


def token_noise(high: np.ndarray, low: np.ndarray, top_k: int = TOP_K) -> np.ndarray:
    """|log p_low - log p_high| for the high-precision run's top-k tokens, `[positions, top_k]`."""
    order = np.argsort(-high, axis=1, kind="stable")[:, :top_k]
    return np.abs(np.take_along_axis(low, order, 1) - np.take_along_axis(high, order, 1))


def flips(high: np.ndarray, low: np.ndarray) -> list[dict[str, float]]:
    """Positions where the low-precision argmax differs, with the float32 gap it crossed."""
    found = []
    for position in np.nonzero(high.argmax(1) != low.argmax(1))[0]:
        row_high, row_low = high[position], low[position]
        chosen = int(row_low.argmax())
        found.append({
            "position": int(position),
            "high_top": int(row_high.argmax()),
            "low_top": chosen,
            "high_gap": float(row_high.max() - row_high[chosen]),
        })
    return found


def distribution(values: np.ndarray) -> dict[str, float]:
    flat = np.asarray(values, dtype=np.float64).ravel()
    if flat.size == 0:
        return {"count": 0}
    quantiles = np.quantile(flat, [0.5, 0.9, 0.99, 0.999])
    return {
        "count": int(flat.size),
        "mean": float(flat.mean()),
        "p50": float(quantiles[0]),
        "p90": float(quantiles[1]),
        "p99": float(quantiles[2]),
        "p99.9": float(quantiles[3]),
        "max": float(flat.max()),
    }


def suggest_margin(pair_gaps: np.ndarray, flip_gaps: list[float], safety: float = SAFETY_FACTOR) -> float:
    """The near-tie margin: `safety` x the largest noise seen (pair gaps, and the gaps flips crossed), in 0.01s."""
    largest = max([float(np.max(pair_gaps)) if pair_gaps.size else 0.0, *flip_gaps])
    return math.ceil(safety * largest * 100.0) / 100.0


def full_logprobs(reference: ReferenceModel, tokens: list[int]) -> np.ndarray:
    """Teacher-forced log-probabilities `[len(tokens), vocab]` (float32 math on either precision's logits)."""
    import torch

    prompt = reference.inputs["input_ids"]
    forced = torch.tensor([tokens[:-1]], dtype=prompt.dtype, device=reference.device)
    input_ids = torch.cat([prompt, forced], dim=1)
    inputs = {**reference.inputs, "input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    with torch.inference_mode():
        logits = reference.model(**inputs, use_cache=False, logits_to_keep=len(tokens)).logits[0]
    return torch.log_softmax(logits.float(), dim=-1).cpu().numpy()


def greedy(reference: ReferenceModel, max_new_tokens: int, *, full_budget: bool) -> list[int]:
    """Float32 greedy tokens; with `full_budget` the end token is held off until the budget is spent."""
    import torch

    with torch.inference_mode():
        out = reference.model.generate(
            **reference.inputs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens if full_budget else None,
            do_sample=False, num_beams=1,
        )
    return [int(t) for t in out[0, len(reference.prompt_ids):].tolist()]


def calibrate(
    *,
    model_dir: Path,
    clip_path: Path,
    max_new_tokens: int,
    companions: int,
    device: str,
    low_dtype: str,
    full_budget: bool,
) -> dict[str, Any]:
    clip = load_clip(clip_path)
    instruction = build_instruction(None)
    audios = [clip.samples, *batch_companions(clip.samples, companions)]
    pair_gaps, token_diffs, all_flips, per_audio = [], [], [], []
    for index, audio in enumerate(audios):
        high = ReferenceModel(model_dir, audio=audio, instruction=instruction, dtype="float32", device=device)
        low = ReferenceModel(model_dir, audio=audio, instruction=instruction, dtype=low_dtype, device=device)
        tokens = greedy(high, max_new_tokens, full_budget=full_budget)
        if not tokens:
            continue
        lp_high, lp_low = full_logprobs(high, tokens), full_logprobs(low, tokens)
        pair_gaps.append(pair_gap_noise(lp_high, lp_low))
        token_diffs.append(token_noise(lp_high, lp_low))
        found = flips(lp_high, lp_low)
        all_flips.extend({**flip, "audio": index} for flip in found)
        per_audio.append({"audio": index, "tokens": len(tokens), "flips": len(found)})
    pairs = np.concatenate(pair_gaps) if pair_gaps else np.zeros((0,))
    tokens_all = np.concatenate(token_diffs) if token_diffs else np.zeros((0,))
    return {
        "what": f"teacher-forced reference, {low_dtype} against float32, top-{TOP_K} tokens per position",
        "checkpoint": {"path": str(model_dir), **checkpoint_identity(model_dir, revision=None)},
        "clip": {"name": clip.name, "sha256": clip.sha256_file, "companions": companions},
        "max_new_tokens": max_new_tokens,
        "full_budget": full_budget,
        "device": device,
        "machine": {"cpu": runtime_identity()["accelerator"], "cores": os.cpu_count(), "platform": platform.platform()},
        "versions": {"torch": _version("torch"), "transformers": _version("transformers")},
        "per_audio": per_audio,
        "token_abs_logprob_diff": distribution(tokens_all),
        "pair_gap_abs_diff": distribution(pairs),
        "flips": all_flips,
        "safety_factor": SAFETY_FACTOR,
        "suggested_margin": suggest_margin(pairs, [flip["high_gap"] for flip in all_flips]),
    }


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure BF16-against-float32 log-prob noise; suggest a margin.")
    parser.add_argument("--model", type=Path, help="Checkpoint folder (default: the embedded tiny checkpoint).")
    parser.add_argument("--clip", type=Path, default=FROZEN_CLIP_PATH)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--companions", type=int, default=7, help="Batch companions of the clip measured too.")
    parser.add_argument(
        "--full-budget", action=argparse.BooleanOptionalAction, default=True,
        help="Hold off the end token until the budget is spent (more positions, less certain ones).",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--low-dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--out", type=Path, help="Write the full result (JSON) here.")
    args = parser.parse_args(argv)
    if args.model is None:
        args.model = ensure_tiny_checkpoint()
    result = calibrate(
        model_dir=args.model, clip_path=args.clip, max_new_tokens=args.max_new_tokens,
        companions=args.companions, device=args.device, low_dtype=args.low_dtype, full_budget=args.full_budget,
    )
    result["command"] = " ".join(["python -m qualification.calibrate", *(argv if argv is not None else sys.argv[1:])])
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    summary = {k: result[k] for k in ("token_abs_logprob_diff", "pair_gap_abs_diff", "suggested_margin")}
    print(json.dumps({**summary, "flips": len(result["flips"])}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
