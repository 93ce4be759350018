"""Long-audio acceptance run: a 47-minute program natively and chunked, a 2:47:59 one chunked.

Starts a gateway on the embedded tiny checkpoint sized for the model's 90-minute
native pass (encoder budget 67,500 tokens, context 131,072), builds synthetic
programs (the frozen two-voice clip repeated between pauses, over noise), sends

1. the 47-minute program with no chunking request (the native track),
2. the same program with a `server_vad` chunking_strategy (the chunked track, asked for explicitly),
3. a 2:47:59 program with `chunking_strategy=auto` (too long for one pass, so the server chunks it),

and prints, for each, the track, the cut list and its hash, per-chunk stops and
the global speakers; it writes the responses as JSON. The tiny model writes
little that is meaningful on most of this audio: the run checks the tracks'
mechanics and their evidence, not transcript quality.

    .venv/bin/python tools/longform_check.py --out /tmp/longform.json
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from gateway_process import ADMIN_TOKEN, GatewayProcess, gateway_env  # noqa: E402

from qualification.clip import FROZEN_CLIP_PATH  # noqa: E402


def program(duration_s: float, seed: int) -> bytes:
    """The clip every 60 s over faint noise, 16-bit WAV."""
    clip, rate = sf.read(FROZEN_CLIP_PATH, dtype="float32")
    rng = np.random.default_rng(seed)
    samples = (rng.standard_normal(int(duration_s * rate)) * 0.003).astype(np.float32)
    for start in range(5, int(duration_s) - 15, 60):
        samples[start * rate : start * rate + len(clip)] += clip
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def summarise(name: str, response: httpx.Response, seconds: float) -> dict:
    body = response.json()
    if response.status_code != 200:
        print(f"{name}: HTTP {response.status_code} {body['error']['code']}: {body['error']['message']}")
        return {"name": name, "status": response.status_code, "error": body["error"]}
    moss = body["moss"]
    chunks = moss.get("chunks", [])
    print(
        f"{name}: HTTP 200 in {seconds:.1f} s, track {moss['track']}, stop {moss['stop']['stop']}, "
        f"truncated {moss['truncated']}, {moss['tokens']['generated']} tokens, {len(body['segments'])} segments, "
        f"speakers {sorted({s['speaker'] for s in body['segments']})}"
    )
    if chunks:
        plan = moss["cut_plan"]
        print(f"  cut plan {plan['sha256'][:16]}…: {len(plan['cuts'])} chunks")
        for chunk in chunks:
            print(
                f"  chunk {chunk['index']:>2} {chunk['start_s']:>8.2f}-{chunk['end_s']:>8.2f} s: "
                f"stop {chunk['stop']['stop']:<10} {chunk['tokens']['generated']:>5} tokens"
            )
    return {"name": name, "status": 200, "seconds": round(seconds, 2), "response": body}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--native-s", type=float, default=47 * 60 + 41.5)
    parser.add_argument("--chunked-s", type=float, default=2 * 3600 + 47 * 60 + 59)
    parser.add_argument("--max-tokens", default="400", help="budget per engine pass (keeps the CPU run short)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="longform-"))
    env = gateway_env(
        base,
        VLLM_ALLOW_LONG_MAX_MODEL_LEN="1",  # the tiny config declares 40,960 positions
        MOSS_GATEWAY_ENGINE__MAX_MODEL_LEN="131072",
        MOSS_GATEWAY_ENGINE__MAX_NUM_BATCHED_TOKENS="67500",
        MOSS_GATEWAY_ENGINE__KV_CACHE_MEMORY_BYTES=str(512 << 20),
        MOSS_GATEWAY_AUDIO__MAX_DURATION_S="5400",
        MOSS_GATEWAY_LONGFORM__MAX_DURATION_S="14400",
        MOSS_GATEWAY_QUALIFICATION__QUALIFY_ON_START="true",
    )
    for name in ("MOSS_GATEWAY_LONGFORM__TARGET_S", "MOSS_GATEWAY_LONGFORM__OVERLAP_S",
                 "MOSS_GATEWAY_LONGFORM__SEARCH_S", "MOSS_GATEWAY_LONGFORM__MAX_CHUNK_S"):
        env.pop(name, None)  # the production cut policy: 600 s chunks, 10 s overlap
    gateway = GatewayProcess(env=env, log_path=base / "gateway.log").start()
    results = []
    try:
        started = time.monotonic()
        gateway.wait_ready(timeout=900)
        print(f"gateway ready and qualified in {time.monotonic() - started:.0f} s")
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        cases = [
            ("47-min native", program(args.native_s, 1), {}),
            ("47-min chunked", program(args.native_s, 1), {"chunking_strategy": json.dumps({"type": "server_vad"})}),
            ("2:47:59 chunked", program(args.chunked_s, 2), {"chunking_strategy": "auto"}),
            ("2:47:59 native (refused)", program(args.chunked_s, 2), {}),
        ]
        for name, data, fields in cases:
            t0 = time.monotonic()
            response = httpx.post(
                f"{gateway.url}/v1/audio/transcriptions", headers=headers, timeout=3600,
                files={"file": ("program.wav", data, "audio/wav")},
                data={"response_format": "diarized_json", "max_completion_tokens": args.max_tokens, **fields},
            )
            results.append(summarise(name, response, time.monotonic() - t0))
    finally:
        gateway.stop()
    args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
