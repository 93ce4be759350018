"""The app factory and the lifespan that owns the engine.

`create_app` builds a fresh app around one settings object; nothing heavy runs
at import time. The engine starts in the background once the server is up, so
/health answers at once while /ready waits for the engine and the gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Protocol

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import __version__
from service.access import ApiKeyMiddleware
from service.admission import AdmissionController
from service.api import admin, system
from service.api.transcriptions import router as transcriptions
from service.body_deadline import BodyDeadlineMiddleware
from service.engine.protocol import TranscriptionEngine
from service.errors import install_error_handlers
from service.ledger import JsonLinesLedger
from service.metrics import GatewayMetrics
from service.settings import GatewaySettings
from service.state import EngineStatus, GatewayState
from service.upload_limit import UploadLimitMiddleware

logger = logging.getLogger(__name__)


class StartableEngine(TranscriptionEngine, Protocol):
    def start(self) -> None:
        """Load the engine (blocking; runs in a worker thread)."""
        ...


EngineFactory = Callable[[GatewaySettings], StartableEngine]
#: Runs once the engine is ready: resolves the identity and opens or keeps closed the gate.
ReadyHook = Callable[[GatewayState], Awaitable[None]]


def resolve_model_dir(settings: GatewaySettings) -> Path:
    """The checkpoint directory: the configured one, or the embedded tiny checkpoint."""
    if settings.engine.model is None:
        from service.checkpoint import ensure_tiny_checkpoint

        return ensure_tiny_checkpoint(settings.cache_dir)
    path = Path(settings.engine.model).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(settings.engine.model, revision=settings.engine.revision))


def model_name(settings: GatewaySettings) -> str:
    if settings.engine.served_model_name:
        return settings.engine.served_model_name
    if settings.engine.model is None:
        from service.checkpoint import TINY_CHECKPOINT_NAME

        return TINY_CHECKPOINT_NAME
    return Path(settings.engine.model).name or settings.engine.model


#: KV cache of the embedded tiny checkpoint when none is configured (plenty for its 64-wide decoder).
EMBEDDED_KV_CACHE_BYTES = 256 << 20


def vllm_engine_factory(settings: GatewaySettings) -> StartableEngine:
    from service.engine.vllm_engine import VllmTranscriptionEngine

    engine_settings = settings.engine
    if settings.uses_embedded_checkpoint:
        # The tiny checkpoint is float32 (vLLM's CPU "auto" would pick bfloat16) with a small KV cache.
        updates: dict[str, object] = {}
        if engine_settings.dtype == "auto":
            updates["dtype"] = "float32"
        if engine_settings.kv_cache_memory_bytes is None:
            updates["kv_cache_memory_bytes"] = EMBEDDED_KV_CACHE_BYTES
        if engine_settings.enforce_eager is None:
            updates["enforce_eager"] = True
        engine_settings = engine_settings.model_copy(update=updates)
    return VllmTranscriptionEngine(
        engine_settings,
        model_dir=resolve_model_dir(settings),
        max_num_batched_tokens=settings.effective_max_num_batched_tokens,
        max_audio_samples=int(settings.max_duration_s * 16_000),
    )


async def _start_engine(state: GatewayState, factory: EngineFactory, on_ready: ReadyHook | None) -> None:
    def build() -> StartableEngine:
        engine = factory(state.settings)
        engine.start()
        return engine

    state.engine_status = EngineStatus.STARTING
    try:
        state.engine = await asyncio.to_thread(build)
    except Exception as exc:
        logger.exception("engine failed to start")
        state.engine_status = EngineStatus.FAILED
        state.engine_error = f"{type(exc).__name__}: {exc}"
        return
    state.engine_starts += 1
    state.engine_status = EngineStatus.READY
    state.engine_error = None
    state.metrics.engine_ready.set(1)
    if on_ready is not None:
        try:
            await on_ready(state)
        except Exception as exc:
            logger.exception("start-up qualification step failed")
            state.gate.reason = f"start-up qualification step failed: {type(exc).__name__}: {exc}"


async def _supervise(state: GatewayState, factory: EngineFactory, on_ready: ReadyHook | None) -> None:
    """Start the engine, watch its health, restart it when it dies.

    A restarted engine goes through the gate again: its identity is resolved
    anew, and only a passing record for that identity reopens transcription.
    """
    lifecycle = state.settings.lifecycle
    await _start_engine(state, factory, on_ready)
    while True:
        await asyncio.sleep(lifecycle.health_check_interval_s)
        engine = state.engine
        if state.engine_status is EngineStatus.READY and engine is not None:
            try:
                await asyncio.wait_for(engine.check_health(), timeout=30)
            except Exception as exc:
                logger.error("engine health check failed: %s", exc)
                state.mark_engine_dead(f"health check failed: {exc}")
        if state.engine_status is EngineStatus.DEAD and lifecycle.restart_engine:
            logger.warning("restarting the engine after: %s", state.engine_error)
            state.gate.open = False
            state.gate.reason = f"the engine is restarting after: {state.engine_error}"
            state.metrics.qualified.set(0)
            old, state.engine = state.engine, None
            if old is not None:
                with contextlib.suppress(Exception):
                    await old.shutdown()
            await _start_engine(state, factory, on_ready)


async def _drain(state: GatewayState) -> None:
    """Stop taking work, let in-flight requests finish up to the deadline, then abort the rest."""
    deadline = state.settings.lifecycle.drain_timeout_s
    state.engine_status = EngineStatus.STOPPING
    if not await state.admission.wait_idle(deadline):
        logger.warning("shutdown: %d requests still running after %g s; aborting them", state.admission.active, deadline)


def create_app(
    settings: GatewaySettings | None = None,
    *,
    engine_factory: EngineFactory | None = None,
    on_ready: ReadyHook | None = None,
) -> FastAPI:
    """A new gateway app; `engine_factory` defaults to the real vLLM engine."""
    settings = settings or GatewaySettings()
    factory = engine_factory or vllm_engine_factory
    if on_ready is None and engine_factory is None:
        from service.gate import open_gate_from_records

        on_ready = open_gate_from_records

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state: GatewayState = app.state.gateway
        supervisor = asyncio.create_task(_supervise(state, factory, on_ready))
        state.background.add(supervisor)
        try:
            yield
        finally:
            await _drain(state)
            for task in list(state.background):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            if state.engine is not None:
                await state.engine.shutdown()

    app = FastAPI(
        title="MOSS-Transcribe-Diarize gateway",
        version=__version__,
        lifespan=lifespan,
        description="OpenAI-compatible transcription on a qualified, pinned vLLM engine.",
    )
    metrics = GatewayMetrics()
    app.state.gateway = GatewayState(
        settings=settings,
        model_name=model_name(settings),
        metrics=metrics,
        request_ledger=JsonLinesLedger(settings.state_dir / "ledger" / "requests.jsonl"),
        admission=admission_controller(settings, metrics),
    )
    install_error_handlers(app)
    app.add_middleware(
        UploadLimitMiddleware,
        max_upload_bytes=settings.audio.max_upload_bytes,
        max_body_bytes=settings.server.max_body_bytes,
    )
    access = settings.access
    admin_token = settings.server.admin_token
    app.add_middleware(
        ApiKeyMiddleware,
        keys=access.load_keys(),
        # The admin token also opens /v1/* (admin-only request fields travel with it); API keys never open /admin.
        extra_keys=(admin_token.get_secret_value().encode(),) if admin_token else (),
        protect_health=access.protect_health,
        protect_metrics=access.protect_metrics,
    )
    server = settings.server
    # Outermost of the request-shaping middleware: its deadlines hold for every route.
    app.add_middleware(
        BodyDeadlineMiddleware,
        total_timeout_s=server.body_timeout_s,
        idle_timeout_s=server.body_idle_timeout_s,
        min_rate_bytes_s=server.body_min_rate_bytes_s,
    )
    app.include_router(system.router)
    app.include_router(admin.router)
    app.include_router(transcriptions.router)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    return app


def admission_controller(settings: GatewaySettings, metrics: GatewayMetrics) -> AdmissionController:
    limits = settings.limits
    return AdmissionController(
        # Unset: as many as the engine decodes in one batch, so the gateway never starves the engine.
        max_concurrent=limits.max_concurrent_requests or settings.engine.max_num_seqs,
        max_queued=limits.max_queued_requests,
        queue_timeout_s=limits.queue_timeout_s,
        retry_after_s=limits.retry_after_s,
        metrics=metrics,
    )


class RequestMetricsMiddleware:
    """Counts every response by route template, status and error code.

    A plain ASGI middleware (not BaseHTTPMiddleware, which buffers streaming
    bodies through a queue and hides a client's disconnect from the stream).
    """

    def __init__(self, app: ASGIApp, *, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        seen: dict[str, str] = {}

        async def observing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = str(message["status"])
                for name, value in message.get("headers", []):
                    if name.lower() == b"x-error-code":
                        seen["code"] = value.decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, observing_send)
        finally:
            if "status" in seen:
                route = getattr(scope.get("route"), "path", "unmatched")
                self.metrics.requests.labels(route, seen["status"], seen.get("code", "")).inc()
