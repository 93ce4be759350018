"""The HTTP load generator: a separate process, so its work never shares the gateway's GIL.

``python -m bench.client SPEC.json OUT.json``. The spec names the gateway URL, the
admin token (the benchmark's ``ignore_eos=true`` is an admin-only field), the WAV
files (one per request, in order), the concurrency, the requests per worker and
the forced output length. Every worker sends its requests back to back (closed
loop). Non-streaming requests ask for ``verbose_json`` so that each response
carries the gateway's own timings; streaming requests note the arrival of the
first ``transcript.text.delta`` event (the client-side time to first token).

``"kind": "vllm"`` drives vLLM's own server instead (``vllm serve``): its form
(``model``, ``max_completion_tokens``, ``json``), no token, no evidence; its
generated tokens are counted from its ``/metrics`` by the caller.

``"processes": P`` splits the load over P client processes (`shard_specs`): one
Python process builds and uploads 384 KB multipart bodies at about 166 requests a
second on a 2-core machine (7.5 ms of CPU each; tools/client_capacity.py), so a burst of 128-256
uploads would otherwise spend most of a short block in the load generator. The
shards start together at an agreed ``start_at`` on the host's monotonic clock
(shared by all processes of one host), after each has opened its first connection;
the merged wall time runs from that start to the last answer.

Only the standard library and httpx are needed (both on the GPU host).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx


def _form(spec: dict[str, Any]) -> dict[str, str]:
    if spec.get("kind") == "vllm":
        # vLLM's own server: no ignore_eos over HTTP (its /metrics counts the tokens), no moss evidence
        return {
            "model": spec["model"],
            "max_completion_tokens": str(spec["output_tokens"]),
            "temperature": "0",
            "response_format": "json",
        }
    form = {
        "max_completion_tokens": str(spec["output_tokens"]),
        "ignore_eos": "true",
        "temperature": "0",
    }
    if spec.get("chunking_strategy"):  # the chunked track (bench.dp's program block)
        form["chunking_strategy"] = spec["chunking_strategy"]
    if spec.get("stream"):
        form.update(stream="true", response_format="json")
    else:
        # verbose_json carries the gateway's timings but makes it ask the engine for log-probabilities
        # (its segments' avg_logprob): the interleaved protocol asks for plain json, as vllm serve gets
        form["response_format"] = spec.get("response_format", "verbose_json")
    return form


def parse_server_timing(value: str) -> dict[str, float]:
    """The gateway's `Server-Timing` header (`name;dur=ms, ...`) as {name: ms}; entries without a duration are left out."""
    phases: dict[str, float] = {}
    for entry in value.split(","):
        name, _, duration = entry.strip().partition(";dur=")
        if name and duration:
            phases[name] = float(duration)
    return phases


async def _one(client: httpx.AsyncClient, spec: dict[str, Any], index: int, payload: bytes) -> dict[str, Any]:
    url = spec["url"].rstrip("/") + "/v1/audio/transcriptions"
    headers = {"Authorization": f"Bearer {spec['token']}"} if spec.get("token") else {}
    files = {"file": (f"clip-{index}.wav", payload, "audio/wav")}
    record: dict[str, Any] = {"index": index}
    started = time.monotonic()
    record["t_start"] = started
    if spec.get("stream"):
        first = None
        final: dict[str, Any] | None = None
        async with client.stream("POST", url, data=_form(spec), files=files, headers=headers) as response:
            record["status"] = response.status_code
            if response.status_code != 200:
                record["error"] = (await response.aread()).decode(errors="replace")[:2000]
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    event = json.loads(line[5:])
                    kind = event.get("type")
                    if kind == "transcript.text.delta" and first is None:
                        first = time.monotonic()
                    elif kind == "transcript.text.done":
                        final = event
                    elif kind == "error":
                        record["error"] = json.dumps(event)[:2000]
        done = time.monotonic()
        record["ttft_client_s"] = None if first is None else first - started
        moss = (final or {}).get("moss") or {}
    else:
        response = await client.post(url, data=_form(spec), files=files, headers=headers)
        done = time.monotonic()
        record["status"] = response.status_code
        moss = {}
        if response.status_code == 200 and spec.get("kind") == "vllm":
            record["text_chars"] = len(response.json().get("text") or "")
        elif response.status_code == 200:
            moss = response.json().get("moss") or {}
            record["header_generated_tokens"] = int(response.headers.get("x-moss-generated-tokens", "-1"))
            if not moss:  # plain json: the count is in the evidence headers
                moss = {"tokens": {"generated": record["header_generated_tokens"]}}
            record["qualification_id"] = response.headers.get("x-moss-qualification-id")
            record["server_timing_ms"] = parse_server_timing(response.headers.get("server-timing", ""))
        else:
            record["error"] = response.text[:2000]
    record["t_end"] = done
    record["latency_s"] = done - started
    timings = moss.get("timings") or {}
    record["server"] = {
        "total_s": timings.get("total_s"),
        "ttft_s": timings.get("time_to_first_token_s"),
        "decode_s": timings.get("decode_s"),
        "decode_tokens_per_s": timings.get("decode_tokens_per_s"),
    }
    tokens = moss.get("tokens") or {}
    record["prompt_tokens"] = tokens.get("prompt")
    record["generated_tokens"] = tokens.get("generated")
    record["stop"] = (moss.get("stop") or {}).get("stop")
    return record


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    payloads = [Path(p).read_bytes() for p in spec["files"]]
    concurrency = int(spec["concurrency"])
    per_worker = int(spec["requests_per_worker"])
    if len(payloads) < concurrency * per_worker:
        raise ValueError("fewer files than requests")
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    timeout = httpx.Timeout(None)
    records: list[dict[str, Any]] = []
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        # one small request first, so connection set-up stays out of the measured ones
        await client.get(spec["url"].rstrip("/") + "/health")

        async def worker(w: int) -> None:
            for k in range(per_worker):
                index = w * per_worker + k
                records.append(await _one(client, spec, index, payloads[index]))

        start_at = spec.get("start_at")
        if start_at is not None:  # a shard: every shard begins at the same instant
            await asyncio.sleep(max(0.0, float(start_at) - time.monotonic()))
        started = time.monotonic()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        finished = time.monotonic()
    records.sort(key=lambda r: r["index"])
    return {"wall_s": finished - started, "t_start": started, "t_end": finished, "records": records}


def shard_specs(spec: dict[str, Any], processes: int, start_at: float) -> list[dict[str, Any]]:
    """Split one closed-loop spec over `processes` shards: whole workers each, their files in worker order.

    Worker w's requests are files[w * per_worker : (w + 1) * per_worker], as in `run`; shard i takes the
    workers i, i + P, i + 2P, ... so the shards differ by at most one worker.
    """
    concurrency, per_worker = int(spec["concurrency"]), int(spec["requests_per_worker"])
    if processes < 1 or processes > concurrency:
        raise ValueError(f"processes must be 1..{concurrency}, not {processes}")
    shards = []
    for i in range(processes):
        workers = list(range(i, concurrency, processes))
        files = [spec["files"][w * per_worker + k] for w in workers for k in range(per_worker)]
        shards.append({**spec, "processes": 1, "concurrency": len(workers), "files": files, "start_at": start_at,
                       "index_base": [w * per_worker for w in workers]})
    return shards


def merge_shards(spec: dict[str, Any], outs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from the shards': records renumbered to the unsharded indices, wall from the common start."""
    per_worker = int(spec["requests_per_worker"])
    records: list[dict[str, Any]] = []
    for shard, out in zip(shard_specs(spec, len(outs), 0.0), outs, strict=True):
        for record in out["records"]:
            local_worker, k = divmod(record["index"], per_worker)
            records.append({**record, "index": shard["index_base"][local_worker] + k})
    records.sort(key=lambda r: r["index"])
    started, finished = min(o["t_start"] for o in outs), max(o["t_end"] for o in outs)
    return {"wall_s": finished - started, "t_start": started, "t_end": finished, "records": records,
            "processes": len(outs), "shard_walls_s": [round(o["wall_s"], 4) for o in outs]}


def run_sharded(spec: dict[str, Any], processes: int, *, lead_s: float = 2.0) -> dict[str, Any]:
    """Run the spec as `processes` client processes starting together `lead_s` from now, and merge them."""
    start_at = time.monotonic() + lead_s + 0.05 * processes
    with tempfile.TemporaryDirectory(prefix="bench-client-") as work:
        paths = []
        for i, shard in enumerate(shard_specs(spec, processes, start_at)):
            spec_path, out_path = Path(work) / f"shard{i}.json", Path(work) / f"shard{i}-out.json"
            spec_path.write_text(json.dumps(shard))
            paths.append((spec_path, out_path))
        children = [subprocess.Popen([sys.executable, "-m", "bench.client", str(a), str(b)]) for a, b in paths]
        for child in children:
            child.wait()
        outs = [json.loads(b.read_text()) for _, b in paths if b.exists()]
    if len(outs) != processes:
        raise RuntimeError(f"{processes - len(outs)} client shard(s) wrote no result")
    return merge_shards(spec, outs)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m bench.client SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    processes = int(spec.get("processes", 1))
    result = run_sharded(spec, processes) if processes > 1 else asyncio.run(run(spec))
    Path(args[1]).write_text(json.dumps(result))
    failed = [r for r in result["records"] if r.get("status") != 200 or r.get("error")]
    if failed:
        print(f"bench.client: {len(failed)} request(s) failed: {failed[0].get('error', '')[:500]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
