"""vLLM's multimodal processor never runs on the gateway's event loop (service/engine/vllm_engine.py).

The fake engine behaves as vLLM 0.26's `AsyncLLM` does: handed a raw prompt,
its `add_request` runs the processor (here a 0.3 s sleep) on the caller's event
loop; handed a rendered input (one with a "type"), it does not. Its renderer,
like vLLM's, processes on a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from service.engine.protocol import GenerationRequest
from service.settings import EngineSettings

pytest.importorskip("vllm")

PROCESSING_S = 0.3


class FakeRenderer:
    """Renders on a worker thread, as vLLM's renderer does."""

    def __init__(self) -> None:
        self.rendered = 0
        self.cached: list[bool] = []

    async def render_cmpl_async(self, prompts: list[dict[str, Any]], *, skip_mm_cache: bool = False) -> list[dict[str, Any]]:
        await asyncio.to_thread(time.sleep, PROCESSING_S)
        self.rendered += len(prompts)
        self.cached.append(not skip_mm_cache)
        return [{"type": "multimodal", **prompt} for prompt in prompts]


class FakeAsyncLLM:
    """vLLM 0.26's `AsyncLLM` as far as the adapter sees it."""

    errored = False

    def __init__(self) -> None:
        self.renderer = FakeRenderer()
        self.model_config = SimpleNamespace(is_encoder_decoder=False)
        self.inputs: list[dict[str, Any]] = []

    async def generate(
        self, prompt: dict[str, Any], params: Any, request_id: str, *, data_parallel_rank: int | None = None
    ) -> AsyncIterator[Any]:
        if "type" not in prompt:
            time.sleep(PROCESSING_S)  # the processor, synchronously, on the caller's event loop
        self.inputs.append(prompt)
        completion = SimpleNamespace(token_ids=[7], text="x", finish_reason="length", stop_reason=None, logprobs=None)
        yield SimpleNamespace(outputs=[completion], finished=True, prompt_token_ids=[1, 2, 3], metrics=None)

    async def abort(self, request_id: str) -> None:
        return None


def _engine(tmp_path: Path) -> Any:
    from service.engine.vllm_engine import VllmTranscriptionEngine

    engine = VllmTranscriptionEngine(
        EngineSettings(), model_dir=tmp_path, max_num_batched_tokens=4096, max_audio_samples=16_000,
        shutdown_timeout_s=5.0,
    )
    engine._engine = FakeAsyncLLM()
    engine._prompts = SimpleNamespace(prompt_ids=lambda instruction: [1, 2, 3])
    return engine


async def _longest_stall(work: Any) -> float:
    """The longest time between two runs of a 10 ms ticker (or the end of `work`) while `work` ran."""
    ticks = [time.monotonic()]

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.01)
            ticks.append(time.monotonic())

    ticker = asyncio.create_task(tick())
    try:
        await work
    finally:
        ticker.cancel()
    ticks.append(time.monotonic())
    return max(later - earlier for earlier, later in zip(ticks, ticks[1:], strict=False)) - 0.01


async def _run(engine: Any, index: int) -> None:
    request = GenerationRequest(
        request_id=f"chunk-{index}", audio=np.zeros(16_000, dtype=np.float32), instruction="i", max_tokens=4
    )
    async for _ in engine.generate(request):
        pass


def test_chunks_are_processed_off_the_event_loop(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    asyncio.run(_run(engine, -1))  # first call: the adapter's own vLLM imports, not what is measured
    engine._engine = FakeAsyncLLM()

    async def chunks() -> None:
        await asyncio.gather(*(_run(engine, index) for index in range(3)))

    stall = asyncio.run(_longest_stall(chunks()))
    assert stall < PROCESSING_S / 2, f"the event loop stalled {stall:.2f} s while the chunks were processed"
    assert engine._engine.renderer.rendered == 3
    assert all(prompt["type"] == "multimodal" for prompt in engine._engine.inputs)


def test_the_rendered_input_carries_the_prompt_and_the_audio(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    asyncio.run(_run(engine, 0))
    (rendered,) = engine._engine.inputs
    assert rendered["prompt_token_ids"] == [1, 2, 3]
    audio, rate = rendered["multi_modal_data"]["audio"]
    assert rate == 16_000 and audio.dtype == np.float32 and audio.shape == (16_000,)


def test_rendering_leaves_the_sender_cache_alone(tmp_path: Path) -> None:
    """A pass cancelled after rendering must not leave the core's cache record claiming its audio."""
    engine = _engine(tmp_path)
    asyncio.run(_run(engine, 0))
    assert engine._engine.renderer.cached == [False]


def test_the_final_update_says_how_long_the_features_took(tmp_path: Path) -> None:
    """The pass's log line separates feature time from the engine's (how a staggered chunk start shows)."""
    engine = _engine(tmp_path)
    request = GenerationRequest(request_id="c0", audio=np.zeros(16_000, dtype=np.float32), instruction="i", max_tokens=4)

    async def final() -> Any:
        updates = [update async for update in engine.generate(request)]
        return updates[-1]

    timings = asyncio.run(final()).timings
    assert timings.render_s is not None and timings.render_s >= PROCESSING_S * 0.9
    assert timings.rendered <= timings.finished
    assert f"features {timings.render_s:.2f} s" in timings.summary()
