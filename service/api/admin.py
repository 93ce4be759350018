"""Admin routes (qualification) and the public backend identity.

Admin routes need `Authorization: Bearer <server.admin_token>`, compared in
constant time; with no admin token configured they refuse every request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any, BinaryIO

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from service.access import bearer_token, key_matches
from service.errors import ErrorCode, GatewayError
from service.evidence import evidence_bundle_path
from service.forms import ADMIN_CLIP_FORM
from service.gate import (
    QualificationBusy,
    qualification_board,
    record_store,
    record_summary,
    refresh_gate,
    run_qualification,
)
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
    """This process's job if it ran one, else the board's (another front-end process may run it)."""
    task = state.qualification_task
    if task is not None:
        running, progress, last = not task.done(), state.gate.progress, state.last_qualification
    else:
        published = qualification_board(state).read() or {}
        running, progress, last = bool(published.get("running")), published.get("progress"), published.get("last")
    refresh_gate(state)
    return {
        "running": running,
        "progress": progress,
        "gate_open": state.gate.open,
        "fingerprint": state.gate.fingerprint,
        "qualification_id": state.gate.qualification_id,
        "reason": state.gate.reason,
        "last": last,
    }


#: Longest clip file name kept (bytes of UTF-8; a typical file-system limit).
MAX_CLIP_NAME_BYTES = 255
_CLIP_FORM_SCHEMA = {
    "requestBody": {
        "required": False,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"clip": {"type": "string", "format": "binary", "description": "Your own clip."}},
                }
            }
        },
    }
}


def clip_file_name(filename: str | None) -> str:
    """The uploaded clip's file name, reduced to its last component; refuses what is not a plain name.

    The name only labels the clip in the record and the temporary file, but a
    name like `..` would otherwise address the temporary folder's parent.
    """
    name = (filename or "clip.wav").replace("\\", "/").rsplit("/", 1)[-1]
    if name in ("", ".", "..") or not name.isprintable() or len(name.encode("utf-8", "replace")) > MAX_CLIP_NAME_BYTES:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"The clip's file name must be a plain file name of at most {MAX_CLIP_NAME_BYTES} bytes.",
            param="clip",
        )
    return name


def _save_clip(source: BinaryIO, folder: Path, name: str) -> Path:
    """Copy the spooled upload into `folder` in blocks (no whole copy in memory)."""
    source.seek(0)
    path = folder / name
    with path.open("xb") as target:
        shutil.copyfileobj(source, target)
    return path


async def _receive_clip(request: Request) -> tuple[Path, Path] | None:
    """Parse the (authenticated) form within ADMIN_CLIP_FORM; the clip saved as (folder, path), or None without one."""
    form = await ADMIN_CLIP_FORM.parse(request)
    try:
        clip = form.get("clip")
        if clip is None:
            return None
        if isinstance(clip, str):
            raise GatewayError(ErrorCode.INVALID_REQUEST, "'clip' must be a file part, not a text field.", param="clip")
        name = clip_file_name(clip.filename)
        if not clip.size:
            raise GatewayError(ErrorCode.EMPTY_FILE, "The uploaded clip is empty.", param="clip")
        folder = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="moss-clip-"))
        try:
            return folder, await asyncio.to_thread(_save_clip, clip.file, folder, name)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, folder, True)
            raise
    finally:
        await form.close()


@router.post("/admin/qualify", status_code=202, openapi_extra=_CLIP_FORM_SCHEMA)
async def start_qualification(request: Request) -> JSONResponse:
    """Start a qualification of the serving engine (optionally on an uploaded `clip`).

    The route declares no body fields, so nothing of the body is read before
    `require_admin` runs: an unauthenticated upload is refused from its headers.
    """
    require_admin(request)
    state = _state(request)
    state.require_engine()
    received = await _receive_clip(request)
    folder, clip_path = received if received is not None else (None, None)
    # Checked after the (awaited) upload, with no await until the new task is registered:
    # two uploads finishing together cannot both start a run.
    task = state.qualification_task
    if (task is not None and not task.done()) or qualification_board(state).is_claimed():
        if folder is not None:
            await asyncio.to_thread(shutil.rmtree, folder, True)
        return JSONResponse(qualification_status(state), status_code=409)

    async def job() -> None:
        try:
            record = await run_qualification(state, clip=clip_path)
            state.last_qualification = record_summary(record)
        except QualificationBusy as exc:  # another process claimed the board in between
            state.gate.progress = f"not started: {exc}"
            state.last_qualification = {"error": str(exc)}
        except Exception as exc:
            logger.exception("qualification failed")
            state.gate.progress = f"failed: {type(exc).__name__}: {exc}"
            state.last_qualification = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            if folder is not None:
                await asyncio.to_thread(shutil.rmtree, folder, True)

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
