"""A scripted engine for the HTTP contract tests.

It implements the same `TranscriptionEngine` protocol as the vLLM adapter: each
character of the scripted transcript is one "token" (its code point), the end
token is appended when the script ends within budget, and `finish_reason`
follows vLLM's conventions, so the gateway's stop classification runs for real.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from service.budget import audio_token_count
from service.engine.protocol import EngineDeadError, EngineTimings, GenerationRequest, GenerationUpdate

EOS = 0x110000 + 1  # outside Unicode: cannot collide with a character token
TEMPLATE_TOKENS = 40


class FakeEngine:
    sample_rate = 16_000

    def __init__(
        self,
        script: str | Callable[[GenerationRequest], str] = (
            "[0.50][S01]Good morning everyone.[1.68][2.60][S02]The pipeline is ready.[3.71]"
        ),
        *,
        max_model_len: int = 4096,
        token_delay_s: float = 0.0,
        model_dir: Path | None = None,
        data_parallel_size: int = 1,
    ) -> None:
        self.script = script
        self.max_model_len = max_model_len
        self.token_delay_s = token_delay_s
        self.eos_token_ids = (EOS,)
        self.kv_bytes_per_token_bf16 = 1024
        self.model_dir = model_dir
        self.requests: list[GenerationRequest] = []
        self.aborted: list[str] = []
        self.running: set[str] = set()
        self.dead = False
        self.started = False
        self.tokens_generated = 0
        self.load_time_s = 0.0
        self.data_parallel_size = data_parallel_size

    def start(self) -> None:
        self.started = True

    async def shutdown(self) -> None:
        self.started = False

    def count_prompt_tokens(self, num_samples: int, instruction: str) -> int:
        return TEMPLATE_TOKENS + len(instruction) + audio_token_count(num_samples) + 2

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return "".join(chr(t) for t in token_ids if t != EOS)

    def token_text(self, token_id: int) -> str:
        return "<eos>" if token_id == EOS else chr(token_id)

    def token_bytes(self, token_ids: Sequence[int]) -> list[bytes]:
        return [b"" if t == EOS else chr(t).encode() for t in token_ids]

    async def attention_backends(self) -> list[str]:
        return ["FAKE"]

    @staticmethod
    def step_logprobs(token: int, top: int) -> dict[int, float]:
        """Scripted log-probabilities: the sampled token at ln 0.9 and the end token at ln 0.05 (the top-k)."""
        step = {token: math.log(0.9)}
        if top > 0 and token != EOS:
            step[EOS] = math.log(0.05)
        return step

    async def rank_devices(self) -> list[dict[str, Any]]:
        return [{"rank": r, "devices": [{"kind": "fake", "index": r}]} for r in range(self.data_parallel_size)]

    def num_running_requests(self) -> int:
        return len(self.running)

    async def check_health(self) -> None:
        if self.dead:
            raise EngineDeadError("fake engine died")

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.running.discard(request_id)

    def describe(self) -> dict[str, Any]:
        return {"engine": "fake", "max_model_len": self.max_model_len}

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationUpdate]:
        if self.dead:
            raise EngineDeadError("fake engine died")
        self.requests.append(request)
        self.running.add(request.request_id)
        prompt = self.count_prompt_tokens(len(request.audio), request.instruction)
        room = min(request.max_tokens, self.max_model_len - prompt)
        script = self.script if isinstance(self.script, str) else self.script(request)
        tokens = [ord(c) for c in script]
        natural_end = len(tokens) + 1 <= room
        produced = tokens[:room] + ([EOS] if natural_end else [])
        timings = EngineTimings(submitted=time.monotonic())
        all_ids: list[int] = []
        all_logprobs: list[dict[int, float]] = []
        finished = False
        try:
            for index, token in enumerate(produced):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                if self.dead:
                    raise EngineDeadError("fake engine died mid-request")
                if timings.first_token is None:
                    timings.first_token = time.monotonic()
                all_ids.append(token)
                step = None if request.want_logprobs is None else [self.step_logprobs(token, request.want_logprobs)]
                all_logprobs += step or []
                self.tokens_generated += 1
                last = index == len(produced) - 1
                update = GenerationUpdate(
                    text_delta="" if token == EOS else chr(token),
                    token_ids_delta=[token],
                    num_generated=len(all_ids),
                    prompt_token_count=prompt,
                    finished=last,
                    logprobs=step,
                )
                if last:
                    finished = True
                    timings.finished = time.monotonic()
                    update.finish_reason = "stop" if natural_end else "length"
                    update.stop_reason = None
                    update.all_token_ids = list(all_ids)
                    update.all_logprobs = None if request.want_logprobs is None else list(all_logprobs)
                    update.text = self.decode(all_ids)
                    update.timings = timings
                yield update
        finally:
            self.running.discard(request.request_id)
            if not finished:
                self.aborted.append(request.request_id)
