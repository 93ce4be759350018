"""The real engine: vLLM in-process through its public Python API.

vLLM's own HTTP server is not used because the gateway needs what it does not
return: generated token IDs, finish and stop reasons, streaming deltas and
abort. The engine core runs in vLLM's child process; this adapter lives in the
gateway's process and owns the `AsyncLLM` client.

With several front-end processes (service/frontends.py), the engine core is
launched by the parent process and each front end's adapter is one of its
`AsyncLLM` clients (`FrontendClient`), as in `vllm serve --api-server-count`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from service.budget import audio_token_count
from service.checkpoint.tokenizer import bytes_to_unicode
from service.engine.protocol import (
    EngineDeadError,
    EngineTimings,
    GenerationRequest,
    GenerationUpdate,
)
from service.engine.ranks import rpc_each_rank
from service.engine.worker_extension import WORKER_EXTENSION
from service.prompt import PromptBuilder
from service.settings import EngineSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")

SAMPLE_RATE = 16_000


def _read_json(path: Path) -> dict[str, Any]:
    try:
        document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return document
    except (OSError, ValueError):
        return {}


def checkpoint_eos_token_ids(model_dir: Path, tokenizer: Any) -> tuple[int, ...]:
    """End tokens as the checkpoint's generation config declares them (then the tokenizer's)."""
    declared = _read_json(model_dir / "generation_config.json").get("eos_token_id")
    if declared is None:
        declared = tokenizer.eos_token_id
    ids = declared if isinstance(declared, list) else [declared]
    return tuple(int(token_id) for token_id in ids if token_id is not None)


def kv_bytes_per_token_bf16(model_dir: Path) -> int:
    """Decoder KV-cache bytes per token in BF16, from the checkpoint's own config."""
    text = _read_json(model_dir / "config.json").get("text_config", {})
    layers = int(text.get("num_hidden_layers", 0))
    kv_heads = int(text.get("num_key_value_heads", text.get("num_attention_heads", 0)))
    head_dim = int(text.get("head_dim") or (int(text.get("hidden_size", 0)) // max(1, int(text.get("num_attention_heads", 1)))))
    return layers * kv_heads * head_dim * 2 * 2


@dataclass(frozen=True)
class FrontendClient:
    """This process's place among the front ends of an engine core that another process launched.

    `addresses` is what vLLM's `APIServerProcessManager` hands each API process
    (its engine sockets, and more in some versions); it goes to `AsyncLLM` as is.
    """

    addresses: dict[str, Any]
    count: int
    index: int


class VllmTranscriptionEngine:
    """`TranscriptionEngine` on vLLM's `AsyncLLM`: its own engine core, or a client of a shared one."""

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        settings: EngineSettings,
        *,
        model_dir: Path,
        max_num_batched_tokens: int,
        max_audio_samples: int,
        shutdown_timeout_s: float,
        frontend: FrontendClient | None = None,
    ) -> None:
        self._settings = settings
        self.frontend = frontend
        self._shutdown_timeout_s = shutdown_timeout_s
        self.model_dir = model_dir
        self._max_num_batched_tokens = max_num_batched_tokens
        self._max_audio_samples = max_audio_samples
        self._engine: Any = None
        self._processor: Any = None
        self._prompts: PromptBuilder | None = None
        self.max_model_len = 0
        self.eos_token_ids: tuple[int, ...] = ()
        self.kv_bytes_per_token_bf16 = kv_bytes_per_token_bf16(model_dir)
        self._special_ids: frozenset[int] = frozenset()
        self.load_time_s: float | None = None
        self.data_parallel_size = int(settings.data_parallel_size)

    # -- start and stop -------------------------------------------------
    def engine_args(self) -> Any:
        from vllm import AsyncEngineArgs

        s = self._settings
        kwargs: dict[str, Any] = dict(
            model=str(self.model_dir),
            revision=s.revision,
            served_model_name=s.served_model_name,
            trust_remote_code=True,
            dtype=s.dtype,
            max_model_len=s.max_model_len,
            max_num_batched_tokens=self._max_num_batched_tokens,
            max_num_seqs=s.max_num_seqs,
            kv_cache_dtype=s.kv_cache_dtype,
            gpu_memory_utilization=s.gpu_memory_utilization,
            kv_cache_memory_bytes=s.kv_cache_memory_bytes,
            enforce_eager=bool(s.enforce_eager),
            quantization=s.quantization,
            data_parallel_size=s.data_parallel_size,
            renderer_num_workers=s.renderer_num_workers,
            # Every pass renders with skip_mm_cache (see render_prompt) and every upload is new audio: the
            # processor cache would only hold memory, and vLLM 0.26 refuses several renderer workers with it.
            mm_processor_cache_gb=0,
            seed=s.seed,
            limit_mm_per_prompt={"audio": {"count": 1, "length": self._max_audio_samples}},
            disable_log_stats=False,
            worker_extension_cls=WORKER_EXTENSION,
        )
        if s.enable_chunked_prefill is not None:
            kwargs["enable_chunked_prefill"] = s.enable_chunked_prefill
        if s.attention_backend is not None:
            kwargs["attention_backend"] = s.attention_backend
        if s.flash_attn_max_num_splits is not None:
            kwargs["attention_config"] = {"flash_attn_max_num_splits_for_cuda_graph": s.flash_attn_max_num_splits}
        if s.async_scheduling is not None:
            kwargs["async_scheduling"] = s.async_scheduling
        if s.distributed_executor_backend is not None:
            kwargs["distributed_executor_backend"] = s.distributed_executor_backend
        if s.cudagraph_mode is not None:
            kwargs["compilation_config"] = {"cudagraph_mode": s.cudagraph_mode}
        if s.cudagraph_capture_sizes is not None:
            kwargs["cudagraph_capture_sizes"] = sorted(set(s.cudagraph_capture_sizes))
        return AsyncEngineArgs(**kwargs)

    def start(self) -> None:
        """Build the engine (blocking: call it from a worker thread)."""
        from transformers import AutoProcessor

        started = time.monotonic()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self._processor = AutoProcessor.from_pretrained(
            str(self.model_dir), trust_remote_code=True, revision=self._settings.revision
        )
        self._prompts = PromptBuilder(self._processor.tokenizer)
        self._engine = self._build_async_llm()
        self.max_model_len = int(self._engine.model_config.max_model_len)
        self.eos_token_ids = checkpoint_eos_token_ids(self.model_dir, self._processor.tokenizer)
        self._special_ids = frozenset(int(t) for t in self._processor.tokenizer.all_special_ids)
        self.load_time_s = time.monotonic() - started
        logger.info("engine ready in %.1f s (max_model_len=%d)", self.load_time_s, self.max_model_len)

    def _build_async_llm(self) -> Any:
        """The engine core and its client; or only the client, when a parent process launched the core."""
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        if self.frontend is None:
            return AsyncLLM.from_engine_args(self.engine_args())
        args = frontend_engine_args(self.engine_args(), count=self.frontend.count, rank=self.frontend.index)
        return AsyncLLM.from_vllm_config(
            args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER),
            usage_context=UsageContext.OPENAI_API_SERVER,
            disable_log_stats=False,
            client_addresses=dict(self.frontend.addresses),
            client_count=self.frontend.count,
            client_index=self.frontend.index,
        )

    async def shutdown(self) -> None:
        """Stop the engine core and its workers in order.

        vLLM's default gives the core 5 s before it kills it, while the core itself
        gives its workers 5 s to exit before it signals them: left at the default,
        the core was killed in the middle of stopping its workers on every
        shutdown. The explicit timeout lets the core finish its own sequence.

        `AsyncLLM.shutdown` stops the core first and cancels its output task on
        this event loop last. Run in a worker thread (it blocks for seconds), it
        leaves that task running while the core's sockets close, and the task
        then logs the closed socket as an EngineDeadError traceback. So the task
        is cancelled here first: by now nothing is in flight (the gateway drained
        or aborted its requests), so it has nothing left to deliver.
        """
        if self._engine is not None:
            engine, self._engine = self._engine, None
            output_task = getattr(engine, "output_handler", None)
            if isinstance(output_task, asyncio.Task) and not output_task.done():
                output_task.cancel()
                await asyncio.wait({output_task})  # its outcome is moot; only our own cancellation propagates
            await asyncio.to_thread(engine.shutdown, timeout=self._shutdown_timeout_s)

    @property
    def vllm_config(self) -> Any:
        return None if self._engine is None else self._engine.vllm_config

    # -- the protocol --------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        return self._processor.tokenizer

    @property
    def prompts(self) -> PromptBuilder:
        """The prompt-ID builder of the served tokenizer (the reference uses the same one)."""
        if self._prompts is None:
            raise EngineDeadError("engine not started")
        return self._prompts

    def prompt_token_ids(self, instruction: str) -> list[int]:
        """The token-ID prompt vLLM receives: user text cannot add special tokens to it."""
        return self.prompts.prompt_ids(instruction)

    def count_prompt_tokens(self, num_samples: int, instruction: str) -> int:
        return self.prompts.template_token_count(instruction) + self.audio_span_length(num_samples)

    def audio_span_length(self, num_samples: int) -> int:
        """Tokens the processor puts between and including audio start and end."""
        span = self._processor._audio_span_ids(audio_token_count(num_samples))
        return len(span) + 2

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int) -> str:
        return str(self.tokenizer.convert_ids_to_tokens(int(token_id)))

    def token_bytes(self, token_ids: Sequence[int]) -> list[bytes]:
        """Each token's bytes: byte-level BPE pieces mapped back to bytes; special tokens add nothing."""
        special = self._special_ids
        pieces = self.tokenizer.convert_ids_to_tokens([int(t) for t in token_ids])
        return [b"" if token in special else _piece_bytes(piece) for token, piece in zip(token_ids, pieces, strict=True)]

    def num_running_requests(self) -> int:
        return 0 if self._engine is None else int(self._engine.get_num_unfinished_requests())

    async def check_health(self) -> None:
        if self._engine is None:
            raise EngineDeadError("engine not started")
        if self._engine.errored:
            raise EngineDeadError(f"engine died: {self._engine.dead_error!r}")
        await self._engine.check_health()

    async def abort(self, request_id: str) -> None:
        if self._engine is not None:
            await self._engine.abort(request_id)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationUpdate]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self._engine is None or self._engine.errored:
            raise EngineDeadError("engine is not running")
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            ignore_eos=request.ignore_eos,
            skip_special_tokens=True,
            logprobs=request.want_logprobs,
            output_kind=RequestOutputKind.DELTA if request.stream_deltas else RequestOutputKind.FINAL_ONLY,
            seed=self._settings.seed if request.temperature > 0 else None,
        )
        prompt = {
            # Token IDs, not text: vLLM's MOSS processor replaces the placeholder's IDs with the
            # audio span either way, and the instruction's text can no longer reach the tokenizer's
            # special-token matching.
            "prompt_token_ids": self.prompt_token_ids(request.instruction),
            "multi_modal_data": {"audio": (np.asarray(request.audio, dtype=np.float32), self.sample_rate)},
        }
        timings = EngineTimings(submitted=time.monotonic())
        engine_input = await self._render(prompt)
        timings.rendered = time.monotonic()
        all_ids: list[int] = []
        all_logprobs: list[dict[int, float]] = []
        text_parts: list[str] = []
        finished = False
        try:
            async for output in self._engine.generate(
                engine_input, params, request.request_id, data_parallel_rank=request.data_parallel_rank
            ):
                completion = output.outputs[0]
                new_ids = list(completion.token_ids)
                if new_ids and timings.first_token is None:
                    timings.first_token = time.monotonic()
                all_ids.extend(new_ids)
                text_parts.append(completion.text)
                finished = bool(output.finished)
                step_logprobs = _logprob_dicts(completion.logprobs)
                if step_logprobs is not None:
                    all_logprobs.extend(step_logprobs)
                update = GenerationUpdate(
                    text_delta=completion.text,
                    token_ids_delta=new_ids,
                    num_generated=len(all_ids),
                    prompt_token_count=len(output.prompt_token_ids or ()),
                    prompt_token_ids=list(output.prompt_token_ids) if finished and output.prompt_token_ids else None,
                    finished=finished,
                    logprobs=step_logprobs,
                )
                if finished:
                    timings.finished = time.monotonic()
                    stats = getattr(output, "metrics", None)
                    _engine_core_timings(timings, stats)
                    latency = getattr(stats, "first_token_latency", 0.0) or 0.0
                    if not request.stream_deltas and latency > 0:
                        # One final output only: the engine's own arrival-to-first-token time.
                        timings.first_token = timings.submitted + latency
                    update.finish_reason = completion.finish_reason
                    update.stop_reason = completion.stop_reason
                    update.all_token_ids = all_ids
                    update.all_logprobs = all_logprobs if request.want_logprobs is not None else None
                    update.text = "".join(text_parts)
                    update.timings = timings
                yield update
        except Exception as exc:
            if self._engine is not None and self._engine.errored:
                raise EngineDeadError(str(exc)) from exc
            raise
        finally:
            if not finished and self._engine is not None:
                # The consumer went away (client disconnect): free the engine's slot.
                await self._engine.abort(request.request_id)

    async def _render(self, prompt: dict[str, Any]) -> Any:
        return await render_prompt(self._engine.renderer, self._engine.model_config, prompt)

    async def attention_backends(self) -> list[str]:
        """The attention backends the engine's workers actually selected."""
        if self._engine is None:
            return []
        try:
            engine = self._engine
            per_worker = await answered_in_time(
                lambda: engine.collective_rpc("moss_attention_backends", timeout=IDENTITY_RPC_TIMEOUT_S)
            )
        except EngineDeadError:
            raise
        except Exception as exc:  # the identity records that it could not be read
            logger.warning("could not read the attention backend from the workers: %s", exc)
            return ["unknown"]
        return sorted({name for names in per_worker for name in names})

    async def rank_devices(self) -> list[dict[str, Any]]:
        """Every data-parallel rank's workers' devices, asked of each rank's engine core."""
        if self._engine is None:
            return []
        try:
            core = self._engine.engine_core
            per_rank = await answered_in_time(
                lambda: rpc_each_rank(core, "moss_device", timeout=IDENTITY_RPC_TIMEOUT_S)
            )
        except EngineDeadError:
            raise
        except Exception as exc:  # the identity records that it could not be read
            logger.warning("could not read the devices from the workers: %s", exc)
            return [{"rank": rank, "devices": ["unknown"]} for rank in range(self.data_parallel_size)]
        return [{"rank": rank, "devices": workers} for rank, workers in enumerate(per_rank)]

    def describe(self) -> dict[str, Any]:
        """Engine facts that can change the output (the identity issue extends this)."""
        config = self.vllm_config
        if config is None:
            return {}
        model_config = config.model_config
        cache_config = config.cache_config
        scheduler = config.scheduler_config
        compilation = config.compilation_config
        return {
            "dtype": str(model_config.dtype).removeprefix("torch."),
            "max_model_len": int(model_config.max_model_len),
            "max_num_batched_tokens": int(scheduler.max_num_batched_tokens),
            "max_num_seqs": int(scheduler.max_num_seqs),
            "chunked_prefill": bool(scheduler.enable_chunked_prefill),
            "kv_cache_dtype": str(cache_config.cache_dtype),
            "enforce_eager": bool(model_config.enforce_eager),
            "cudagraph_mode": str(getattr(compilation, "cudagraph_mode", None)),
            "cudagraph_capture_sizes": list(getattr(compilation, "cudagraph_capture_sizes", None) or []),
            "async_scheduling": bool(getattr(scheduler, "async_scheduling", False)),
            "flash_attn_max_num_splits": getattr(
                getattr(config, "attention_config", None), "flash_attn_max_num_splits_for_cuda_graph", None
            ),
            "quantization": model_config.quantization,
            "data_parallel_size": int(config.parallel_config.data_parallel_size),
            "seed": self._settings.seed,
            "requested_attention_backend": self._settings.attention_backend,
        }


#: How long the workers may take to answer an identity question (vLLM's own RPC timeout), and how
#: long the round trip may take before it is asked again: the workers answer in milliseconds.
IDENTITY_RPC_TIMEOUT_S = 10.0
#: Times an unanswered identity question is asked before the engine counts as dead.
IDENTITY_RPC_ATTEMPTS = 2


async def answered_in_time(ask: Callable[[], Awaitable[T]]) -> T:
    """The answer of an RPC to the engine core; asked again once, then `EngineDeadError` when none comes.

    vLLM's RPC timeout bounds the workers, not the round trip: a request or an
    answer lost between a client and its core (it happened to front ends whose
    socket files the parent had removed too early: `LaunchedEngine.listeners`)
    would leave the caller waiting forever. An engine that cannot answer its identity cannot
    serve; marked dead, it is restarted.
    """
    for attempt in range(1, IDENTITY_RPC_ATTEMPTS + 1):
        try:
            return await asyncio.wait_for(ask(), timeout=IDENTITY_RPC_TIMEOUT_S)
        except TimeoutError:
            logger.warning("the engine core did not answer in %g s (attempt %d)", IDENTITY_RPC_TIMEOUT_S, attempt)
    raise EngineDeadError(
        f"the engine core did not answer within {IDENTITY_RPC_TIMEOUT_S:g} s, {IDENTITY_RPC_ATTEMPTS} times"
    )


def frontend_engine_args(engine_args: Any, *, count: int, rank: int) -> Any:
    """Engine arguments as one of `count` API processes sees them (`rank` -1: the parent that launches the core).

    vLLM reads the API-process count and rank from these two private fields of
    `AsyncEngineArgs`, which `vllm serve --api-server-count` sets the same way;
    the engine core sizes its client sockets and stats from them.
    """
    engine_args._api_process_count = count
    engine_args._api_process_rank = rank
    return engine_args


async def render_prompt(renderer: Any, model_config: Any, prompt: dict[str, Any]) -> Any:
    """The prompt through vLLM's multimodal processor on its renderer's worker thread, as vLLM's own server does.

    Why not hand `generate` the raw prompt: vLLM 0.26's `AsyncLLM.add_request`
    runs the processor (the Whisper feature extractor over the whole span, and
    its hashing) synchronously on this event loop. A chunked program's chunks
    then block the loop one after another, and the first chunk's first token
    waits for every chunk's features (on the H200: 3.07 s before, 0.84 s after,
    docs/benchmarks.md). A rendered input makes `add_request` skip that
    step; later vLLMs (0.32) already process raw prompts off the loop, so there
    it changes nothing.

    Why `skip_mm_cache`: the renderer's own cache records every item it
    processes as held by the engine core, which then receives only its hash.
    A pass cancelled between rendering and submission (a client gone, a
    failed sibling chunk) would leave that record wrong, and the same audio
    sent again would reach the core without its data. Uncached rendering
    always ships the features; no record can be wrong. (The engine arguments
    also turn that cache off: see `engine_args`.)

    Several passes render at once on the renderer's `renderer_num_workers`
    threads (tools/render_spread.py measures the spread of a program's chunks).
    """
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    (engine_input,) = await renderer.render_cmpl_async([parse_model_prompt(model_config, prompt)], skip_mm_cache=True)
    return engine_input


def _engine_core_timings(timings: EngineTimings, stats: Any) -> None:
    """Queue, prefill and decode time as the engine core measured them (its monotonic clock)."""
    queued = getattr(stats, "queued_ts", 0.0) or 0.0
    scheduled = getattr(stats, "scheduled_ts", 0.0) or 0.0
    first = getattr(stats, "first_token_ts", 0.0) or 0.0
    last = getattr(stats, "last_token_ts", 0.0) or 0.0
    if queued and scheduled:
        timings.engine_queue_s = max(0.0, scheduled - queued)
    if scheduled and first:
        timings.engine_prefill_s = max(0.0, first - scheduled)
    if first and last:
        timings.engine_decode_s = max(0.0, last - first)


def _logprob_dicts(logprobs: Any) -> list[dict[int, float]] | None:
    if not logprobs:
        return None
    return [{int(token_id): float(entry.logprob) for token_id, entry in step.items()} for step in logprobs]


#: Byte-level BPE pieces (the tokenizer's alphabet) back to the bytes they stand for.
_BYTE_LEVEL = {char: byte for byte, char in bytes_to_unicode().items()}


def _piece_bytes(piece: str) -> bytes:
    """A byte-level piece's bytes; a piece outside that alphabet (an added token) is its UTF-8 text."""
    if all(char in _BYTE_LEVEL for char in piece):
        return bytes(_BYTE_LEVEL[char] for char in piece)
    return piece.encode("utf-8")
