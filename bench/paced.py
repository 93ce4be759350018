"""A paced stand-in engine: the gateway's own cost measured on a CPU, without vLLM.

``python -m bench run --workload short --paced-engine-ms 2.7 ...`` runs the same
cells, the same client and the same direct path against this engine instead of
vLLM. Every running request gets one token per step of ``step_ms`` (a continuous
batch whose step time does not grow with the batch), with vLLM-like text deltas
(`` w12345``). What remains between the gateway and the direct rows is the
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


class Profiler:
    """cProfile of the event-loop thread, switched on around the gateway blocks."""

    def __init__(self, path: Path | None) -> None:
        import cProfile

        self.path = path
        self.profile = cProfile.Profile() if path else None

    def __enter__(self) -> Profiler:
        if self.profile is not None:
            self.profile.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.profile is not None:
            self.profile.disable()

    def dump(self) -> None:
        if self.profile is None or self.path is None:
            return
        import io
        import pstats

        self.profile.dump_stats(str(self.path.with_suffix(".prof")))
        buffer = io.StringIO()
        stats = pstats.Stats(self.profile, stream=buffer).sort_stats("cumulative")
        stats.print_stats(60)
        buffer.write("\n\n--- by own time ---\n")
        stats.sort_stats("tottime").print_stats(40)
        self.path.write_text(buffer.getvalue())
