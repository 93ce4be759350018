"""Every error the gateway can answer, in one table.

Code anywhere in the gateway raises `GatewayError(ErrorCode.X, message)`; the
handlers installed by `install_error_handlers` turn it into the HTTP status and
OpenAI error envelope `{"error": {"message", "type", "param", "code"}}` listed
here. Nothing else decides a status code, so the table is the API's contract.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)


class ErrorCode(str, enum.Enum):
    """The `code` field of the OpenAI error body."""

    # The request itself.
    INVALID_REQUEST = "invalid_request"
    MISSING_FILE = "missing_file"
    EMPTY_FILE = "empty_file"
    INVALID_AUDIO = "invalid_audio"
    UNSUPPORTED_MEDIA = "unsupported_media_type"
    AUDIO_TOO_SHORT = "audio_too_short"
    AUDIO_TOO_LONG = "audio_too_long"
    ENCODER_BUDGET_EXCEEDED = "encoder_budget_exceeded"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    UPLOAD_TOO_LARGE = "upload_too_large"
    BODY_TIMEOUT = "request_body_timeout"
    INVALID_RESPONSE_FORMAT = "invalid_response_format"
    STREAM_NOT_SUPPORTED = "stream_not_supported_for_format"
    INVALID_BUDGET = "invalid_max_completion_tokens"
    MODEL_NOT_FOUND = "model_not_found"
    UNSUPPORTED_PARAMETER = "unsupported_parameter"
    UNSUPPORTED_TASK = "unsupported_task"
    NOT_FOUND = "not_found"
    # Access and load.
    UNAUTHORIZED = "unauthorized"
    RATE_LIMITED = "too_many_requests"
    REQUEST_TIMEOUT = "request_timeout"
    # The backend.
    BACKEND_NOT_QUALIFIED = "backend_not_qualified"
    ENGINE_NOT_READY = "engine_not_ready"
    ENGINE_ERROR = "engine_error"
    QUALIFICATION_FAILED = "qualification_failed"


@dataclass(frozen=True)
class ErrorSpec:
    status: int
    type: str


_INVALID = "invalid_request_error"

#: The one table from error to HTTP status and OpenAI error type.
ERROR_TABLE: dict[ErrorCode, ErrorSpec] = {
    ErrorCode.INVALID_REQUEST: ErrorSpec(400, _INVALID),
    ErrorCode.MISSING_FILE: ErrorSpec(400, _INVALID),
    ErrorCode.EMPTY_FILE: ErrorSpec(400, _INVALID),
    ErrorCode.INVALID_AUDIO: ErrorSpec(400, _INVALID),
    ErrorCode.UNSUPPORTED_MEDIA: ErrorSpec(415, _INVALID),
    ErrorCode.AUDIO_TOO_SHORT: ErrorSpec(400, _INVALID),
    ErrorCode.AUDIO_TOO_LONG: ErrorSpec(400, _INVALID),
    ErrorCode.ENCODER_BUDGET_EXCEEDED: ErrorSpec(400, _INVALID),
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: ErrorSpec(400, _INVALID),
    ErrorCode.UPLOAD_TOO_LARGE: ErrorSpec(413, _INVALID),
    ErrorCode.BODY_TIMEOUT: ErrorSpec(408, _INVALID),
    ErrorCode.INVALID_RESPONSE_FORMAT: ErrorSpec(400, _INVALID),
    ErrorCode.STREAM_NOT_SUPPORTED: ErrorSpec(400, _INVALID),
    ErrorCode.INVALID_BUDGET: ErrorSpec(400, _INVALID),
    ErrorCode.MODEL_NOT_FOUND: ErrorSpec(404, _INVALID),
    ErrorCode.UNSUPPORTED_PARAMETER: ErrorSpec(400, _INVALID),
    ErrorCode.UNSUPPORTED_TASK: ErrorSpec(400, _INVALID),
    ErrorCode.NOT_FOUND: ErrorSpec(404, _INVALID),
    ErrorCode.UNAUTHORIZED: ErrorSpec(401, "authentication_error"),
    ErrorCode.RATE_LIMITED: ErrorSpec(429, "rate_limit_error"),
    ErrorCode.REQUEST_TIMEOUT: ErrorSpec(504, "timeout_error"),
    ErrorCode.BACKEND_NOT_QUALIFIED: ErrorSpec(503, "service_unavailable"),
    ErrorCode.ENGINE_NOT_READY: ErrorSpec(503, "service_unavailable"),
    ErrorCode.ENGINE_ERROR: ErrorSpec(500, "server_error"),
    ErrorCode.QUALIFICATION_FAILED: ErrorSpec(409, "qualification_error"),
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str


class ErrorEnvelope(BaseModel):
    """OpenAI's error body, for the OpenAPI schema."""

    error: ErrorDetail


def documented_errors(*codes: ErrorCode) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for a route: each status it can answer, with the codes behind it."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(ERROR_TABLE[code].status, []).append(code.value)
    return {
        status: {"model": ErrorEnvelope, "description": "Error codes: " + ", ".join(names)}
        for status, names in sorted(by_status.items())
    }


class GatewayError(Exception):
    """The one error type of the gateway; `ERROR_TABLE` maps it to HTTP."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return ERROR_TABLE[self.code].status

    def body(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TABLE[self.code].type,
                "param": self.param,
                "code": self.code.value,
            }
        }

    def sse_event(self) -> dict[str, Any]:
        """The same error as a stream's last event (a stream has already answered 200)."""
        return {"type": "error", **self.body()}


def error_response(error: GatewayError) -> JSONResponse:
    """The OpenAI envelope; the code also travels as a header for the request metrics."""
    headers = {**error.headers, "X-Error-Code": error.code.value}
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _describe_validation_error(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "The request is invalid.", None
    first = errors[0]
    location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "form")]
    param = ".".join(location) or None
    return f"Invalid value for '{param}': {first.get('msg', 'invalid')}.", param


#: Errors raised as plain HTTP exceptions by the framework (routing, body limits).
_HTTP_STATUS_CODES = {
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.INVALID_REQUEST,
    408: ErrorCode.BODY_TIMEOUT,
    413: ErrorCode.UPLOAD_TOO_LARGE,
}


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure through the one table."""

    @app.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _describe_validation_error(exc)
        return error_response(GatewayError(ErrorCode.INVALID_REQUEST, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_STATUS_CODES.get(exc.status_code, ErrorCode.INVALID_REQUEST)
        error = GatewayError(code, str(exc.detail), param="file" if code is ErrorCode.UPLOAD_TOO_LARGE else None)
        return JSONResponse(error.body(), status_code=exc.status_code, headers={"X-Error-Code": code.value})

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return error_response(GatewayError(ErrorCode.ENGINE_ERROR, f"Internal error: {type(exc).__name__}."))
