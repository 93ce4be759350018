"""Admin routes (qualification) and the public backend identity.

Admin routes need `Authorization: Bearer <server.admin_token>`, compared in
constant time; with no admin token configured they refuse every request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Request, UploadFile
from fastapi.responses import JSONResponse

from service.access import bearer_token, key_matches
from service.errors import ErrorCode, GatewayError
from service.evidence import evidence_bundle_path
from service.gate import record_store, run_qualification
from service.state import GatewayState

logger = logging.getLogger(__name__)
router = APIRouter()


def _state(request: Request) -> GatewayState:
    return request.app.state.gateway  # type: ignore[no-any-return]


def require_admin(request: Request) -> None:
    token = _state(request).settings.server.admin_token
    if token is None:
        raise GatewayError(
            ErrorCode.UNAUTHORIZED,
            "Admin routes are disabled: set MOSS_GATEWAY_SERVER__ADMIN_TOKEN.",
            headers={"WWW-Authenticate": "Bearer"},
        )
    # The same parser and comparison as the API keys: a bare `Bearer` or an empty token never matches.
    if not key_matches(bearer_token(request.headers.raw), (token.get_secret_value().encode(),)):
        raise GatewayError(
            ErrorCode.UNAUTHORIZED, "Missing or wrong admin token.", headers={"WWW-Authenticate": "Bearer"}
        )


Admin = Annotated[None, Depends(require_admin)]


def qualification_status(state: GatewayState) -> dict[str, Any]:
    task = state.qualification_task
    last = state.last_qualification
    return {
        "running": task is not None and not task.done(),
        "progress": state.gate.progress,
        "gate_open": state.gate.open,
        "fingerprint": state.gate.fingerprint,
        "qualification_id": state.gate.qualification_id,
        "reason": state.gate.reason,
        "last": last,
    }


def _summary(record: dict[str, Any]) -> dict[str, Any]:
    verdict = record["verdict"]
    return {
        "qualification_id": record["qualification_id"],
        "fingerprint": record["fingerprint"],
        "result": verdict["result"],
        "passed": verdict["passed"],
        "batched_result": verdict["batched_result"],
        "batched_passed": verdict["batched_passed"],
        "explanation": verdict["evidence"]["explanation"],
        "first_divergence": verdict["evidence"]["first_divergence"],
        "near_tie_logprob_margin": verdict.get("near_tie_logprob_margin"),
        "near_ties": verdict.get("near_ties"),
        "largest_margin_used": verdict.get("largest_margin_used"),
        "batched_near_ties": verdict.get("batched_near_ties"),
        "batched_largest_margin_used": verdict.get("batched_largest_margin_used"),
        "comparison": record["comparison"],
        "path": record.get("path"),
    }


@router.post("/admin/qualify", status_code=202)
async def start_qualification(
    request: Request, _: Admin, clip: Annotated[UploadFile | None, File()] = None
) -> JSONResponse:
    """Start a qualification of the serving engine (optionally on an uploaded clip)."""
    state = _state(request)
    state.require_engine()
    task = state.qualification_task
    if task is not None and not task.done():
        return JSONResponse(qualification_status(state), status_code=409)
    clip_path: Path | None = None
    if clip is not None and not isinstance(clip, str):
        data = await clip.read()
        if not data:
            raise GatewayError(ErrorCode.EMPTY_FILE, "The uploaded clip is empty.", param="clip")
        folder = Path(tempfile.mkdtemp(prefix="moss-clip-"))
        clip_path = folder / (Path(clip.filename or "clip.wav").name or "clip.wav")
        clip_path.write_bytes(data)

    async def job() -> None:
        try:
            record = await run_qualification(state, clip=clip_path)
            state.last_qualification = _summary(record)
        except Exception as exc:
            logger.exception("qualification failed")
            state.gate.progress = f"failed: {type(exc).__name__}: {exc}"
            state.last_qualification = {"error": f"{type(exc).__name__}: {exc}"}

    state.last_qualification = None
    state.gate.progress = "starting"
    new_task = asyncio.create_task(job())
    state.qualification_task = new_task
    state.background.add(new_task)
    new_task.add_done_callback(state.background.discard)
    return JSONResponse(qualification_status(state), status_code=202)


@router.get("/admin/qualify")
async def get_qualification(request: Request, _: Admin) -> dict[str, Any]:
    return qualification_status(_state(request))


@router.get("/admin/qualification/records")
async def list_records(request: Request, _: Admin) -> dict[str, Any]:
    checks = await asyncio.to_thread(record_store(_state(request)).all)
    return {
        "records": [
            {
                "file": check.path.name,
                "valid": check.valid,
                "reason": check.reason,
                "qualification_id": (check.record or {}).get("qualification_id"),
                "fingerprint": (check.record or {}).get("fingerprint"),
                "result": ((check.record or {}).get("verdict") or {}).get("result"),
            }
            for check in checks
        ]
    }


_REQUEST_ID = re.compile(r"^trsc-[0-9a-f]{32}$")


@router.get("/admin/evidence/{request_id}")
async def get_evidence(request: Request, request_id: str, _: Admin) -> JSONResponse:
    """The full evidence bundle of one request (kept when capture was on)."""
    path = evidence_bundle_path(_state(request).settings.state_dir, request_id)
    if not _REQUEST_ID.match(request_id) or not path.is_file():
        raise GatewayError(ErrorCode.NOT_FOUND, f"No evidence bundle for request '{request_id}'.")
    return JSONResponse(json.loads(await asyncio.to_thread(path.read_text, encoding="utf-8")))


@router.get("/v1/backend")
async def backend(request: Request) -> dict[str, Any]:
    """The running backend's full identity and its qualification state."""
    state = _state(request)
    return {
        "fingerprint": state.gate.fingerprint,
        "identity": state.identity,
        "engine_status": state.engine_status.value,
        "qualification": {
            "qualified": state.gate.open,
            "qualification_id": state.gate.qualification_id,
            "verdict": state.gate.verdict,
            "reason": state.gate.reason,
            "policy": state.settings.qualification.policy,
            "progress": state.gate.progress,
        },
    }
