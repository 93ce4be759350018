"""How far apart a chunked program's chunks reach the engine: vLLM's renderer with 1 and with N workers.

    .venv/bin/python tools/render_spread.py [--model DIR] [--chunks 15] [--chunk-s 200] [--workers 1,4]

A chunked program hands the engine all its chunks at once, but each chunk first needs its audio features,
computed by vLLM's renderer (service.engine.vllm_engine.render_prompt, the gateway's own call). With one
renderer thread (vLLM's default) the chunks are rendered one after another, so the last chunk starts
decoding that much after the first, and the program's wall grows by as much. This renders `--chunks`
noise chunks of `--chunk-s` seconds at once through the renderer built from the gateway's own engine
arguments (no engine core is started) and prints, per worker count, when each chunk was ready: first,
median, last, and the spread (last - first). Default model: the embedded tiny checkpoint (its feature
extractor is the full-size one's: 128 mel bins, 30 s windows).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoProcessor

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from service.checkpoint import ensure_tiny_checkpoint  # noqa: E402
from service.engine.vllm_engine import VllmTranscriptionEngine, render_prompt  # noqa: E402
from service.prompt import DEFAULT_INSTRUCTION, PromptBuilder  # noqa: E402
from service.settings import EngineSettings  # noqa: E402

SAMPLE_RATE = 16_000


def build_renderer(model_dir: Path, workers: int) -> tuple[Any, Any]:
    """vLLM's renderer and model config from the gateway's own engine arguments, with `workers` threads."""
    from vllm.renderers.registry import renderer_from_config

    adapter = VllmTranscriptionEngine(
        EngineSettings(renderer_num_workers=workers, enforce_eager=True), model_dir=model_dir,
        max_num_batched_tokens=40_960, max_audio_samples=3000 * SAMPLE_RATE, shutdown_timeout_s=5.0,
    )
    config = adapter.engine_args().create_engine_config()
    return renderer_from_config(config), config.model_config


async def ready_offsets(renderer: Any, model_config: Any, prompts: list[dict[str, Any]]) -> tuple[list[float], float]:
    """Seconds from the common start to each chunk's rendered input, and the wall of the whole batch."""
    start = time.monotonic()

    async def one(prompt: dict[str, Any]) -> float:
        await render_prompt(renderer, model_config, prompt)
        return time.monotonic() - start

    offsets = await asyncio.gather(*(one(p) for p in prompts))
    return sorted(offsets), time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint (default: the embedded tiny one)")
    parser.add_argument("--chunks", type=int, default=15)
    parser.add_argument("--chunk-s", type=float, default=200.0)
    parser.add_argument("--workers", default="1,4", help="comma-separated renderer worker counts")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model_dir = args.model or ensure_tiny_checkpoint()
    tokenizer = AutoProcessor.from_pretrained(str(model_dir), trust_remote_code=True).tokenizer
    ids = PromptBuilder(tokenizer).prompt_ids(DEFAULT_INSTRUCTION)
    rng = np.random.default_rng(0)
    prompts = [
        {"prompt_token_ids": ids,
         "multi_modal_data": {"audio": ((0.1 * rng.standard_normal(int(args.chunk_s * SAMPLE_RATE))).astype(np.float32), SAMPLE_RATE)}}
        for _ in range(args.chunks)
    ]
    rows = []
    for workers in [int(w) for w in args.workers.split(",") if w]:
        renderer, model_config = build_renderer(model_dir, workers)
        asyncio.run(ready_offsets(renderer, model_config, prompts[:1]))  # first render: imports and caches
        offsets, wall = asyncio.run(ready_offsets(renderer, model_config, prompts))
        row = {"workers": workers, "chunks": args.chunks, "chunk_s": args.chunk_s, "first_s": round(offsets[0], 3),
               "median_s": round(statistics.median(offsets), 3), "last_s": round(offsets[-1], 3),
               "spread_s": round(offsets[-1] - offsets[0], 3), "wall_s": round(wall, 3), "cpus": os.cpu_count()}
        rows.append(row)
        print(json.dumps(row))
    if args.out is not None:
        args.out.write_text(json.dumps({"kind": "render_spread", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
