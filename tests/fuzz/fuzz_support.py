"""What every fuzz test checks: no 5xx, and every refusal is the OpenAI envelope from the error table."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from service.errors import ERROR_TABLE, ErrorCode

KNOWN_CODES = {code.value: code for code in ErrorCode}
ENVELOPE_KEYS = {"message", "type", "param", "code"}
#: Codes that mean the gateway, not the request, failed: never an answer to client input.
SERVER_CODES = {ErrorCode.ENGINE_ERROR.value, ErrorCode.ENGINE_NOT_READY.value, ErrorCode.BACKEND_NOT_QUALIFIED.value}


def envelope_problems(status: int, headers: Mapping[str, Any], content: bytes) -> list[str]:
    """Why this response breaks the error contract (empty when it keeps it)."""
    problems: list[str] = []
    if status >= 500:
        problems.append(f"server error {status}")
    if status < 400:
        return problems
    content_type = str(_header(headers, "content-type") or "")
    if not content_type.startswith("application/json"):
        problems.append(f"error body is {content_type or 'untyped'}, not JSON")
        return problems
    try:
        body = json.loads(content)
    except ValueError as exc:
        return [*problems, f"error body is not JSON: {exc}"]
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return [*problems, f"error body is not the OpenAI envelope: {str(body)[:300]}"]
    error = body["error"]
    if set(error) != ENVELOPE_KEYS:
        problems.append(f"error keys {sorted(error)} are not {sorted(ENVELOPE_KEYS)}")
    if not isinstance(error.get("message"), str) or not error.get("message"):
        problems.append("error.message is not a non-empty string")
    if error.get("param") is not None and not isinstance(error.get("param"), str):
        problems.append(f"error.param is {error.get('param')!r}, not a string or null")
    code = error.get("code")
    if code not in KNOWN_CODES:
        problems.append(f"error.code {code!r} is not in the error table")
    else:
        spec = ERROR_TABLE[KNOWN_CODES[code]]
        if error.get("type") != spec.type:
            problems.append(f"error.type {error.get('type')!r} is not the table's {spec.type!r} for {code}")
        if code in SERVER_CODES:
            problems.append(f"error.code {code} blames the server for a client input")
        header = _header(headers, "x-error-code")
        if header is not None and header != code:
            problems.append(f"X-Error-Code {header!r} disagrees with error.code {code!r}")
    return problems


def _header(headers: Mapping[str, Any], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value[0] if isinstance(value, list) else str(value)
    return None
