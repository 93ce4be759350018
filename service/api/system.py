"""Liveness, readiness, models and metrics."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from service.errors import ErrorCode, GatewayError, documented_errors
from service.gate import refresh_gate
from service.state import EngineStatus, GatewayState

router = APIRouter()
_CREATED = int(time.time())


def _state(request: Request) -> GatewayState:
    return request.app.state.gateway  # type: ignore[no-any-return]


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """Liveness: 200 while the replica can serve or recover by itself (the engine may still be loading).

    503 when it cannot: the engine failed `lifecycle.restart_max_attempts` times in a
    row, or it is down with restarts switched off. An orchestrator should then
    replace the replica (restart the container); the reason says what failed.
    """
    state = _state(request)
    process = {"frontend": asdict(state.frontend)} if state.frontend is not None else {}
    problem = state.liveness_problem()
    if problem is not None:
        return JSONResponse({"status": "failing", "reason": problem, **process}, status_code=503)
    return JSONResponse({"status": "alive", **process})


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    """200 only when the engine is loaded, healthy and the backend is qualified."""
    state = _state(request)
    reasons: list[str] = []
    if state.engine_status is not EngineStatus.READY or state.engine is None:
        reasons.append(f"engine {state.engine_status.value}" + (f": {state.engine_error}" if state.engine_error else ""))
    else:
        timeout = state.settings.lifecycle.ready_probe_timeout_s
        try:
            await asyncio.wait_for(state.engine.check_health(), timeout=timeout)
        except TimeoutError:
            # Slow is not dead (the supervisor's probe decides that), but a balancer must not wait on it.
            reasons.append(f"engine health check did not answer within {timeout:g} s")
        except Exception as exc:  # any failure of the health probe means not ready
            state.mark_engine_dead(f"health check failed: {exc}")
            reasons.append(f"engine unhealthy: {exc}")
    if not refresh_gate(state):
        reasons.append(f"backend not qualified: {state.gate.reason}")
    body: dict[str, object] = {
        "ready": not reasons,
        "engine": state.engine_status.value,
        "qualified": state.gate.open,
        "fingerprint": state.gate.fingerprint,
        "qualification_id": state.gate.qualification_id,
        "reasons": reasons,
    }
    if state.frontend is not None:
        body["frontend"] = asdict(state.frontend)
    return JSONResponse(body, status_code=200 if not reasons else 503)


def _model_card(state: GatewayState) -> dict[str, object]:
    """OpenAI's `Model` object for the one model served here."""
    return {"id": state.model_name, "object": "model", "created": _CREATED, "owned_by": "moss-gateway"}


@router.get("/v1/models")
async def models(request: Request) -> dict[str, object]:
    return {"object": "list", "data": [_model_card(_state(request))]}


@router.get("/v1/models/{model_id:path}", responses=documented_errors(ErrorCode.MODEL_NOT_FOUND))
async def model(request: Request, model_id: str) -> dict[str, object]:
    state = _state(request)
    if model_id != state.model_name:
        raise GatewayError(
            ErrorCode.MODEL_NOT_FOUND,
            f"The model '{model_id}' is not served here; GET /v1/models lists '{state.model_name}'.",
            param="model",
        )
    return _model_card(state)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    state = _state(request)
    state.metrics.engine_ready.set(1 if state.engine_status is EngineStatus.READY else 0)
    state.metrics.qualified.set(1 if state.gate.open else 0)
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
