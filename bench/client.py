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

Only the standard library and httpx are needed (both on the GPU host).
"""

from __future__ import annotations

import asyncio
import json
import sys
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


async def _one(client: httpx.AsyncClient, spec: dict[str, Any], index: int, payload: bytes) -> dict[str, Any]:
    url = spec["url"].rstrip("/") + "/v1/audio/transcriptions"
    headers = {"Authorization": f"Bearer {spec['token']}"} if spec.get("token") else {}
    files = {"file": (f"clip-{index}.wav", payload, "audio/wav")}
    record: dict[str, Any] = {"index": index}
    started = time.perf_counter()
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
                        first = time.perf_counter()
                    elif kind == "transcript.text.done":
                        final = event
                    elif kind == "error":
                        record["error"] = json.dumps(event)[:2000]
        done = time.perf_counter()
        record["ttft_client_s"] = None if first is None else first - started
        moss = (final or {}).get("moss") or {}
    else:
        response = await client.post(url, data=_form(spec), files=files, headers=headers)
        done = time.perf_counter()
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

        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        finished = time.perf_counter()
    records.sort(key=lambda r: r["index"])
    return {"wall_s": finished - started, "t_start": started, "t_end": finished, "records": records}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m bench.client SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    result = asyncio.run(run(spec))
    Path(args[1]).write_text(json.dumps(result))
    failed = [r for r in result["records"] if r.get("status") != 200 or r.get("error")]
    if failed:
        print(f"bench.client: {len(failed)} request(s) failed: {failed[0].get('error', '')[:500]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
