"""A paced stand-in engine: the gateway's own cost measured on a CPU, without vLLM.

``python -m bench run --workload short --paced-engine-ms 2.7 ...`` runs the same
cells, the same client and the same direct path against this engine instead of
vLLM. Every running request gets one token per step of ``step_ms`` (a continuous
batch whose step time does not grow with the batch), with vLLM-like text deltas
(`` w12345``); a request with ``stream_deltas=False`` (vLLM's final-only output,
what the gateway asks for unstreamed requests) gets one update at the end, as
vLLM would send it. What remains between the gateway and the direct rows is the
gateway's own work (HTTP, multipart, decoding, budget, per-token plumbing,
parsing, accounting), not the model's. ``--profile FILE`` adds a cProfile of the
event-loop thread during the gateway blocks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from service.budget import audio_token_count
from service.engine.protocol import EngineTimings, GenerationRequest, GenerationUpdate

TEMPLATE_TOKENS = 60
FIRST_TOKEN_ID = 512


class PacedEngine:
    sample_rate = 16_000

    def __init__(self, step_ms: float, *, prefill_ms: float = 40.0, max_model_len: int = 131_072) -> None:
        self.step_s = step_ms / 1000.0
        self.prefill_s = prefill_ms / 1000.0
        self.max_model_len = max_model_len
        self.eos_token_ids = (151_932,)
        self.kv_bytes_per_token_bf16 = 114_688
        self.model_dir = None
        self.load_time_s = 0.0
        self.data_parallel_size = 1
        self._running = 0

    def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    def count_prompt_tokens(self, num_samples: int, instruction: str) -> int:
        audio = audio_token_count(num_samples)
        return TEMPLATE_TOKENS + audio + len(str(int(num_samples / 16_000)))

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return "".join(f" w{t}" for t in token_ids)

    def token_text(self, token_id: int) -> str:
        return f"Ġw{token_id}"

    def token_bytes(self, token_ids: Any) -> list[bytes]:
        return [self.token_text(int(token)).encode() for token in token_ids]

    async def attention_backends(self) -> list[str]:
        return ["PACED"]

    async def rank_devices(self) -> list[dict[str, Any]]:
        return [{"rank": 0, "devices": [{"kind": "paced"}]}]

    def num_running_requests(self) -> int:
        return self._running

    async def check_health(self) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"engine": "paced", "step_ms": self.step_s * 1000, "prefill_ms": self.prefill_s * 1000}

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationUpdate]:
        self._running += 1
        prompt = self.count_prompt_tokens(len(request.audio), request.instruction)
        timings = EngineTimings(submitted=time.monotonic())
        ids: list[int] = []
        parts: list[str] = []
        try:
            loop = asyncio.get_running_loop()
            next_at = loop.time() + self.prefill_s
            if not request.stream_deltas:
                # vLLM's FINAL_ONLY: one output at the end, nothing per token on this loop
                await asyncio.sleep(self.prefill_s + self.step_s * max(0, request.max_tokens - 1))
                timings.first_token = timings.submitted + self.prefill_s
                ids = [FIRST_TOKEN_ID + (hash((request.request_id, i)) % 150_000) for i in range(request.max_tokens)]
                timings.finished = time.monotonic()
                yield GenerationUpdate(
                    text_delta="".join(f" w{t}" for t in ids),
                    token_ids_delta=list(ids),
                    num_generated=len(ids),
                    prompt_token_count=prompt,
                    finished=True,
                    finish_reason="length",
                    all_token_ids=ids,
                    text="".join(f" w{t}" for t in ids),
                    timings=timings,
                )
                return
            for index in range(request.max_tokens):
                delay = next_at - loop.time()
                await asyncio.sleep(max(0.0, delay))
                next_at += self.step_s
                token = FIRST_TOKEN_ID + (hash((request.request_id, index)) % 150_000)
                if timings.first_token is None:
                    timings.first_token = time.monotonic()
                ids.append(token)
                text = f" w{token}"
                parts.append(text)
                last = index == request.max_tokens - 1
                update = GenerationUpdate(
                    text_delta=text,
                    token_ids_delta=[token],
                    num_generated=len(ids),
                    prompt_token_count=prompt,
                    finished=last,
                )
                if last:
                    timings.finished = time.monotonic()
                    update.finish_reason = "length"
                    update.all_token_ids = list(ids)
                    update.text = "".join(parts)
                    update.timings = timings
                yield update
        finally:
            self._running -= 1


def paced_factory(step_ms: float) -> Any:
    def factory(_settings: Any) -> PacedEngine:
        return PacedEngine(step_ms)

    return factory


#: Event-loop CPU of a gateway request, item by item: category -> the functions whose cumulative
#: time (cProfile, event-loop thread) is that item, as (file path suffix, function name). The
#: items up to rendering nest inside the request's ASGI call; what the call spends outside them
#: is "routing and middleware" (Starlette/FastAPI routing, middleware, the endpoint glue). The
#: pipeline's run is its own task (`with_cancellation`), so it and what nests in it (accounting,
#: the engine) are measured from their own roots.
PIPELINE_RUN = "per-token layers and parsing (pass, track, pipeline generators)"
CATEGORIES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("HTTP request parsing (uvicorn)", (
        ("uvicorn/protocols/http/httptools_impl.py", "data_received"),
        ("uvicorn/protocols/http/h11_impl.py", "data_received"),
    )),
    ("response send (uvicorn)", (
        ("uvicorn/protocols/http/httptools_impl.py", "send"),
        ("uvicorn/protocols/http/h11_impl.py", "send"),
    )),
    ("multipart parsing (form, fields, upload read)", (
        ("starlette/requests.py", "_get_form"),
        ("service/api/transcriptions/protocol.py", "parse_form"),
        ("starlette/datastructures.py", "read"),
    )),
    ("decode: thread hop (loop side)", (("service/transcription/pipeline.py", "prepare"),)),
    ("budget and prompt counting", (("service/transcription/pipeline.py", "_plan"),)),
    ("evidence building", (("service/transcription/accountant.py", "evidence"),)),
    ("rendering (openai-type models)", (
        ("service/api/transcriptions/renderers.py", "render_body"),
        ("service/api/transcriptions/renderers.py", "evidence_headers"),
    )),
    ("rendering (JSON encode, response headers)", (
        ("starlette/responses.py", "render"),
        ("starlette/responses.py", "init_headers"),
    )),
    ("metrics and ledger write (loop side)", (("service/transcription/accountant.py", "account"),)),
    (PIPELINE_RUN, (
        ("service/transcription/pipeline.py", "run"),
    )),
    ("engine stand-in (not the gateway)", (("bench/paced.py", "generate"),)),
)
#: The request's whole ASGI call on the loop (everything above except the HTTP server nests in it).
REQUEST_ROOT = ("uvicorn/protocols/http/httptools_impl.py", "run_asgi")
#: Functions of a category that also nest in a later category's function are subtracted from it.
NESTED = {
    "decode: thread hop (loop side)": ("budget and prompt counting",),
    "per-token layers and parsing (pass, track, pipeline generators)": (
        "metrics and ledger write (loop side)", "engine stand-in (not the gateway)",
    ),
}


def _cumulative(stats: Any, wanted: tuple[tuple[str, str], ...]) -> float:
    total = 0.0
    for (filename, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
        for suffix, func in wanted:
            if name == func and filename.replace("\\", "/").endswith(suffix):
                total += ct
    return total


def attribute(stats: Any, requests: int) -> dict[str, float]:
    """Milliseconds of event-loop CPU per gateway request, per item (under the profiler)."""
    raw = {name: _cumulative(stats, funcs) for name, funcs in CATEGORIES}
    for name, inner in NESTED.items():
        raw[name] -= sum(raw[i] for i in inner)
    root = _cumulative(stats, (REQUEST_ROOT, ("uvicorn/protocols/http/h11_impl.py", "run_asgi")))
    names = [name for name, _ in CATEGORIES]
    in_asgi = names[names.index("response send (uvicorn)"):names.index("metrics and ledger write (loop side)")]
    raw["routing, middleware, endpoint glue (rest of the ASGI call)"] = root - sum(raw[k] for k in in_asgi)
    run_task = _cumulative(stats, dict(CATEGORIES)[PIPELINE_RUN])
    total = stats.total_tt
    raw["other loop work (event loop, timers, task switches)"] = total - root - run_task - raw[names[0]]
    scale = 1000.0 / max(1, requests)
    out = {k: v * scale for k, v in raw.items()}
    out["total (profiled)"] = total * scale
    return out


class Profiler:
    """cProfile of the event-loop thread, switched on around the gateway blocks.

    Also counts the gateway requests profiled and the loop thread's CPU time, so that
    `dump` can write the per-request attribution (`attribute`) next to the listing."""

    def __init__(self, path: Path | None) -> None:
        import cProfile

        self.path = path
        # CPU time of the loop thread, not wall time: waits for the GIL held by other threads
        # (decode, ledger) would otherwise be charged to whatever the loop was running
        self.profile = cProfile.Profile(time.thread_time) if path else None
        self.requests = 0
        self.thread_cpu_s = 0.0
        self._started = 0.0

    def __enter__(self) -> Profiler:
        self._started = time.thread_time()
        if self.profile is not None:
            self.profile.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.profile is not None:
            self.profile.disable()
        self.thread_cpu_s += time.thread_time() - self._started

    def dump(self) -> None:
        if self.profile is None or self.path is None:
            return
        import io
        import json
        import pstats

        self.profile.dump_stats(str(self.path.with_suffix(".prof")))
        buffer = io.StringIO()
        stats = pstats.Stats(self.profile, stream=buffer)
        table = attribute(stats, self.requests)
        buffer.write(f"gateway requests profiled: {self.requests}; loop-thread CPU under the profiler: "
                     f"{1000.0 * self.thread_cpu_s / max(1, self.requests):.2f} ms/request\n")
        for name, ms in table.items():
            buffer.write(f"{ms:8.3f} ms/request  {name}\n")
        buffer.write("\n")
        self.path.with_suffix(".json").write_text(json.dumps({"requests": self.requests, "ms_per_request": table}, indent=1))
        stats.sort_stats("cumulative").print_stats(80)
        buffer.write("\n\n--- by own time ---\n")
        stats.sort_stats("tottime").print_stats(50)
        self.path.write_text(buffer.getvalue())
