"""The app factory and the lifespan that owns the engine.

`create_app` builds a fresh app around one settings object; nothing heavy runs
at import time. The engine starts in the background once the server is up, so
/health answers at once while /ready waits for the engine and the gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import __version__
from service.access import ApiKeyMiddleware
from service.admission import AdmissionController, LocalSlots, SlotPool
from service.api import admin, system, web
from service.api.transcriptions import router as transcriptions
from service.api.transcriptions.serving import build_serving
from service.body_deadline import BodyDeadlineMiddleware
from service.checkpoint import TINY_CHECKPOINT_NAME, ensure_tiny_checkpoint
from service.engine.protocol import EngineDeadError, TranscriptionEngine
from service.engine.vllm_engine import FrontendClient, VllmTranscriptionEngine
from service.errors import ErrorCode, install_error_handlers
from service.gate import open_gate_from_records, record_store_for
from service.ledger import JsonLinesLedger, watch_request
from service.metrics import GatewayMetrics
from service.settings import EngineSettings, GatewaySettings, LifecycleSettings
from service.state import EngineStatus, FrontendPosition, GatewayState
from service.transcription.pipeline import build_pipeline
from service.upload_limit import UploadLimitMiddleware

logger = logging.getLogger(__name__)


class StartableEngine(TranscriptionEngine, Protocol):
    def start(self) -> None:
        """Load the engine (blocking; runs in a worker thread)."""
        ...


EngineFactory = Callable[[GatewaySettings], StartableEngine]
#: Runs once the engine is ready: resolves the identity and opens or keeps closed the gate.
ReadyHook = Callable[[GatewayState], Awaitable[None]]
#: A background task for the app's whole life (started by the lifespan, cancelled at shutdown).
Watcher = Callable[[GatewayState], Coroutine[Any, Any, None]]


def resolve_model_dir(settings: GatewaySettings) -> Path:
    """The checkpoint directory: the configured one, or the embedded tiny checkpoint."""
    if settings.engine.model is None:

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

        return TINY_CHECKPOINT_NAME
    return Path(settings.engine.model).name or settings.engine.model


#: KV cache of the embedded tiny checkpoint when none is configured (plenty for its 64-wide decoder).
EMBEDDED_KV_CACHE_BYTES = 256 << 20


def vllm_engine_factory(settings: GatewaySettings, frontend: FrontendClient | None = None) -> VllmTranscriptionEngine:
    """The real engine: its own engine core, or (`frontend`) a client of the core a parent process launched."""
    return VllmTranscriptionEngine(
        effective_engine_settings(settings),
        model_dir=resolve_model_dir(settings),
        max_num_batched_tokens=settings.effective_max_num_batched_tokens,
        max_audio_samples=int(settings.max_duration_s * 16_000),
        shutdown_timeout_s=settings.lifecycle.engine_shutdown_timeout_s,
        frontend=frontend,
    )


def effective_engine_settings(settings: GatewaySettings) -> EngineSettings:
    """The engine settings as served: the embedded tiny checkpoint's own defaults filled in."""
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
    return engine_settings


async def _start_engine(
    state: GatewayState, factory: EngineFactory, on_ready: ReadyHook | None, *, on_loop: bool = False
) -> bool:
    """One attempt to build and start the engine; True when it is up (the failure is recorded otherwise).

    The build runs in a worker thread, which a cancellation cannot stop: when the
    gateway shuts down mid-start, the build is let finish and what it built is shut
    down, so that no engine core process outlives the gateway.
    """

    def build() -> StartableEngine:
        engine = factory(state.settings)
        engine.start()
        return engine

    state.engine_status = EngineStatus.STARTING
    building: asyncio.Future[StartableEngine]
    if on_loop:
        # A front end's engine client is built on the running event loop, as vLLM builds its API
        # processes' clients: its output task then starts reading the core's socket at once. Built in
        # a worker thread instead, a client of a core launched elsewhere now and then never saw the
        # core's answers (seen on the CPU engine, about one start in four).
        building = asyncio.get_running_loop().create_future()
        try:
            building.set_result(build())
        except Exception as exc:
            building.set_exception(exc)
    else:
        building = asyncio.ensure_future(asyncio.to_thread(build))
    try:
        engine = await asyncio.shield(building)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await (await building).shutdown()
        raise
    except Exception as exc:
        logger.exception("engine failed to start")
        state.engine_status = EngineStatus.FAILED
        state.engine_error = f"{type(exc).__name__}: {exc}"
        return False
    state.engine = engine
    state.engine_starts += 1
    state.engine_status = EngineStatus.READY
    state.engine_error = None
    state.metrics.engine_ready.set(1)
    if on_ready is not None:
        try:
            await on_ready(state)
        except EngineDeadError as exc:  # it could not answer its identity: dead, and restarted as such
            logger.error("the engine did not answer at start-up: %s", exc)
            state.mark_engine_dead(str(exc))
            return True
        except Exception as exc:
            if state.shutting_down:
                # The engine stopped under it because the gateway is stopping: expected, not a fault.
                logger.info("start-up qualification step stopped by the shutdown: %s", type(exc).__name__)
                return True
            logger.exception("start-up qualification step failed")
            state.gate.reason = f"start-up qualification step failed: {type(exc).__name__}: {exc}"
    return True


def restart_delay_s(lifecycle: LifecycleSettings, failures: int) -> float:
    """Exponential backoff before the next start: initial x 2^(failures - 1), capped at the maximum."""
    if failures <= 0:
        return 0.0
    return float(min(lifecycle.restart_max_delay_s, lifecycle.restart_initial_delay_s * 2 ** min(failures - 1, 62)))


async def _probe(state: GatewayState, engine: TranscriptionEngine) -> None:
    """One health probe; a failure or a probe slower than its timeout marks the engine dead."""
    timeout = state.settings.lifecycle.health_check_timeout_s
    try:
        await asyncio.wait_for(engine.check_health(), timeout=timeout)
    except TimeoutError:
        reason = f"health check did not answer within {timeout:g} s"
    except Exception as exc:
        reason = f"health check failed: {exc}"
    else:
        state.note_engine_healthy()
        return
    if state.shutting_down:
        return  # the engine stops because the gateway does: not a death
    logger.error("engine %s", reason)
    state.mark_engine_dead(reason)


async def _supervise(
    state: GatewayState, factory: EngineFactory, on_ready: ReadyHook | None, *, on_loop: bool = False
) -> None:
    """Start the engine, watch its health, restart it with backoff when it dies or fails to start.

    A restarted engine goes through the gate again: its identity is resolved
    anew, and only a passing record for that identity reopens transcription.
    After `lifecycle.restart_max_attempts` consecutive failures (failed starts, or
    engines that died before passing a health probe) /health answers 503, so that
    an orchestrator replaces the replica; the supervisor keeps trying meanwhile,
    at the longest backoff, and /health turns 200 again once an engine is healthy.
    With `restart_engine` off, the first failure is final (and /health says so).
    """
    lifecycle = state.settings.lifecycle
    up = await _start_engine(state, factory, on_ready, on_loop=on_loop)
    while True:
        if up:
            await asyncio.sleep(lifecycle.health_check_interval_s)
            engine = state.engine
            if state.engine_status is EngineStatus.READY and engine is not None:
                await _probe(state, engine)
            if state.engine_status is not EngineStatus.DEAD:
                continue  # healthy, or stopping with the gateway
        if state.shutting_down:
            logger.info("the engine stopped with the gateway; not restarting it")
            return
        # Dead (seen by the probe or by a request), or a start that failed.
        state.note_engine_failure(state.engine_error or "the engine stopped")
        if not lifecycle.restart_engine:
            return
        delay = restart_delay_s(lifecycle, state.engine_failures)
        logger.warning(
            "restarting the engine in %g s (consecutive failures: %d) after: %s",
            delay, state.engine_failures, state.engine_error,
        )
        state.gate.open = False
        state.gate.reason = f"the engine is restarting after: {state.engine_error}"
        state.metrics.qualified.set(0)
        old, state.engine = state.engine, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.shutdown()
        await asyncio.sleep(delay)
        up = await _start_engine(state, factory, on_ready, on_loop=on_loop)


async def _drain(state: GatewayState) -> None:
    """Stop taking work, let in-flight requests finish up to the deadline, then abort the rest."""
    deadline = state.settings.lifecycle.drain_timeout_s
    state.begin_shutdown()
    state.engine_status = EngineStatus.STOPPING
    if not await state.admission.wait_idle(deadline):
        logger.warning("shutdown: %d requests still running after %g s; aborting them", state.admission.active, deadline)


async def _shutdown(state: GatewayState) -> None:
    """The orderly stop, in this order: drain, stop the supervisor, stop the engine, flush the ledger.

    The ledger goes last so that the lines of requests aborted by the engine's
    shutdown are still accepted (after `close`, `submit` writes inline).
    """
    await _drain(state)
    for task in list(state.background):
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
    engine, state.engine = state.engine, None
    if engine is not None:
        try:
            await engine.shutdown()
        except Exception:
            logger.exception("engine shutdown failed")
    timeout = state.settings.lifecycle.ledger_flush_timeout_s
    if not await asyncio.to_thread(state.request_ledger.close, timeout):
        logger.error("shutdown: the request ledger was not flushed within %g s", timeout)


def create_app(
    settings: GatewaySettings | None = None,
    *,
    engine_factory: EngineFactory | None = None,
    on_ready: ReadyHook | None = None,
    slots: SlotPool | None = None,
    metrics: GatewayMetrics | None = None,
    frontend: FrontendPosition | None = None,
    watchers: Sequence[Watcher] = (),
) -> FastAPI:
    """A new gateway app; `engine_factory` defaults to the real vLLM engine.

    A front-end process (service/frontends.py) passes the service's shared
    `slots`, multiprocess `metrics`, its `frontend` position and the `watchers`
    that keep it in step with the others; alone, the gateway makes its own.
    """
    settings = settings or GatewaySettings()
    factory = engine_factory or vllm_engine_factory
    if on_ready is None and engine_factory is None:

        # The records' sealing key is checked now (RecordKeyError): an empty, short or readable key
        # refuses the start instead of surfacing at the first qualification.
        record_store_for(settings)
        on_ready = open_gate_from_records

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state: GatewayState = app.state.gateway
        supervisor = asyncio.create_task(_supervise(state, factory, on_ready, on_loop=frontend is not None))
        state.background.add(supervisor)
        state.background.update(asyncio.create_task(watch(state)) for watch in watchers)
        try:
            yield
        finally:
            await _shutdown(state)

    app = FastAPI(
        title="MOSS-Transcribe-Diarize gateway",
        version=__version__,
        lifespan=lifespan,
        description="OpenAI-compatible transcription on a qualified, pinned vLLM engine.",
    )
    metrics = metrics or GatewayMetrics()
    state = GatewayState(
        settings=settings,
        model_name=model_name(settings),
        metrics=metrics,
        request_ledger=JsonLinesLedger(settings.state_dir / "ledger" / "requests.jsonl"),
        admission=admission_controller(settings, metrics, slots),
        frontend=frontend,
    )
    app.state.gateway = state
    # Handlers are built once here, with their collaborators, and read from app.state by the routes.
    app.state.transcription = build_serving(state, build_pipeline(state))
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
    app.include_router(web.router)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    # Outermost: it must see the refusals of every layer below (401, 413, 429) and the requests they cut short.
    app.add_middleware(RequestLedgerMiddleware, state=state)
    return app


def admission_slots(settings: GatewaySettings) -> int:
    """Transcriptions at once; unset: as many as the engine decodes in one batch, so the gateway never starves it."""
    return settings.limits.max_concurrent_requests or settings.engine.max_num_seqs


def admission_controller(
    settings: GatewaySettings, metrics: GatewayMetrics, slots: SlotPool | None = None
) -> AdmissionController:
    limits = settings.limits
    return AdmissionController(
        slots=slots or LocalSlots(admission_slots(settings)),
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


#: Routes whose every answer leaves a ledger line: the transcription routes and the admin routes.
LEDGERED_PATH_PREFIXES = ("/v1/audio/", "/admin/")
#: The ledger's status for a request that got no complete answer (the client left, or shutdown cut it short).
CLIENT_CLOSED_STATUS = 499


class RequestLedgerMiddleware:
    """One ledger line for every answered request to the transcription and admin routes, errors included.

    The transcription pipeline writes its own, richer line for the requests it
    accounts (a finished transcription with its stop evidence, an abort); this
    layer writes one for every request that got none: a refusal by any layer
    (401, 413, 429, 400, 503...), an error, a stream cut short. Its line holds
    the request id, method, path, status, error code, time and duration, never a
    body. An unhandled exception is the 500 `engine_error` that the error
    handler answers; a response that never finished (the client left, or the
    shutdown cancelled it) is status 499 with the HTTP status that was sent, if
    any. Requests without an `X-Request-Id` of their own get one here, on the
    line and in the response headers. The line goes through the ledger's
    `submit`: the event loop never waits for the disk.
    """

    def __init__(self, app: ASGIApp, *, state: GatewayState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(LEDGERED_PATH_PREFIXES):
            await self.app(scope, receive, send)
            return
        request_id = f"trsc-{uuid.uuid4().hex}"
        received = datetime.now(UTC).isoformat()
        started = time.monotonic()
        seen: dict[str, Any] = {"complete": False}

        async def observing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                for name, value in headers:
                    name = name.lower()
                    if name == b"x-error-code":
                        seen["error_code"] = value.decode("latin-1")
                    elif name == b"x-request-id":
                        seen["request_id"] = value.decode("latin-1")
                if "request_id" not in seen:
                    headers.append((b"x-request-id", request_id.encode()))
                    message = {**message, "headers": headers}
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                seen["complete"] = True
            await send(message)

        failed = False
        with watch_request(request_id) as watched:
            try:
                await self.app(scope, receive, observing_send)
            except Exception:
                failed = True
                raise
            finally:
                if watched.lines == 0:
                    self.state.request_ledger.submit(
                        self._line(scope, seen, request_id, received, time.monotonic() - started, failed)
                    )

    def _line(
        self, scope: Scope, seen: dict[str, Any], request_id: str, received: str, duration_s: float, failed: bool
    ) -> dict[str, Any]:
        http_status: int | None = seen.get("status")
        error_code: str | None = seen.get("error_code")
        if http_status is None and failed:
            # Nothing was sent and an exception escaped: the error handler answers it as a 500.
            status, error_code = 500, ErrorCode.ENGINE_ERROR.value
        elif http_status is None or not seen["complete"]:
            status = CLIENT_CLOSED_STATUS
        else:
            status = http_status
        gate = self.state.gate
        return {
            "request_id": seen.get("request_id", request_id),
            "time": received,
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "http_status": http_status,
            "error_code": error_code,
            "complete": seen["complete"],
            "duration_s": round(duration_s, 3),
            "fingerprint": gate.fingerprint,
            "qualification_id": gate.qualification_id,
        }
