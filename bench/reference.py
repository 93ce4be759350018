"""The Transformers reference workloads: the checkpoint's own remote code, ``generate``.

Greedy decoding with the output length forced (``min_new_tokens = max_new_tokens``,
the Transformers equivalent of ``ignore_eos``), one stream, the gateway's exact
prompt. Each timed request starts before the processor runs (feature extraction
is part of a request in vLLM too) and ends when ``generate`` returns on a
synchronised device.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from bench import envinfo
from bench.stats import summarize
from bench.workloads import Cell, describe_cell, noise_pcm16, pcm16_to_float


class _FirstToken:
    """A ``generate`` streamer that notes the first new token (call 1 is the prompt)."""

    def __init__(self, sync: Any) -> None:
        self.calls = 0
        self.at: float | None = None
        self._sync = sync

    def put(self, _value: Any) -> None:
        self.calls += 1
        if self.calls == 2 and self.at is None:
            self._sync()
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


def run_reference_bench(args: Any, cells: list[Cell], out_path: Path, model_dir: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoProcessor

    from service.prompt import build_instruction, build_prompt

    device, dtype = args.reference_device, getattr(torch, args.reference_dtype)
    cuda = device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    result: dict[str, Any] = {
        "kind": "reference",
        "workloads": args.workload,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": envinfo.environment(),
        "reference": {"device": device, "dtype": args.reference_dtype, "model": str(model_dir)},
        "rows": [],
        "records": {},
        "skipped": [],
    }
    started = time.monotonic()
    t0 = time.perf_counter()
    processor = AutoProcessor.from_pretrained(str(model_dir), trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), trust_remote_code=True, dtype=dtype)
    model = model.to(device).eval()
    sync()
    result["reference"]["load_s"] = time.perf_counter() - t0
    result["reference"]["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    eos = model.generation_config.eos_token_id
    eos_ids = [int(x) for x in (eos if isinstance(eos, list) else [eos]) if x is not None]
    pad_id = model.generation_config.pad_token_id
    prompt = build_prompt(build_instruction(None, ()))
    seed = int(args.seed) + 500_000

    def one(samples: Any, n: int) -> dict[str, Any]:
        clock = _FirstToken(sync)
        sync()
        begin = time.perf_counter()
        inputs = processor(text=prompt, audio=[samples], return_tensors="pt")
        inputs = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in inputs.items()}
        inputs["input_features"] = inputs["input_features"].to(dtype)
        prompt_len = int(inputs["input_ids"].shape[1])
        with torch.inference_mode():
            out = model.generate(
                **inputs,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                num_beams=1,
                eos_token_id=eos_ids,
                pad_token_id=pad_id,
                streamer=clock,
            )
        sync()
        done = time.perf_counter()
        generated = int(out.shape[1]) - prompt_len
        return {
            "status": 200,
            "t_start": begin,
            "t_end": done,
            "latency_s": done - begin,
            "ttft_s": None if clock.at is None else clock.at - begin,
            "generated_tokens": generated,
            "prompt_tokens": prompt_len,
        }

    # warm-up: two whole requests of the shortest shape (an 8-token warm-up left the first measured
    # 12 s request on the H200 three times slower than the second)
    warm = min(cells, key=lambda c: c.duration_s)
    for _ in range(2):
        one(pcm16_to_float(noise_pcm16(warm.duration_s, seed)), min(warm.output_tokens, 160))
    for cell in cells:
        remaining = args.deadline_s - (time.monotonic() - started)
        if cell.num_requests * (cell.output_tokens / 10.0 + 2) > remaining and cell.output_tokens > 64:
            note = f"{cell.name}: skipped, {remaining:.0f} s left"
            result["skipped"].append(note)
            continue
        print(f"[bench] {describe_cell(cell)}", flush=True)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        records = []
        wall = 0.0
        for index in range(cell.num_requests):
            seed += 1
            record = one(pcm16_to_float(noise_pcm16(cell.duration_s, seed)), cell.output_tokens)
            record["index"] = index
            wall += record["latency_s"]
            records.append(record)
            print(f"[bench]   {record['latency_s']:.3f} s, {record['generated_tokens']} tokens", flush=True)
        row = summarize(cell, "transformers", wall, records)
        row["peak_torch_allocated_bytes"] = int(torch.cuda.max_memory_allocated()) if cuda else None
        result["rows"].append(row)
        result["records"][f"{cell.name}/transformers"] = records
        _save(out_path, result)
    result["elapsed_s"] = time.monotonic() - started
    _save(out_path, result)
    return result


def _save(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, path)
