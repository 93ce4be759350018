"""API keys for /v1/* (and optionally /health, /ready, /metrics).

Keys are compared in constant time against every configured key; the admin
token (service/api/admin.py) is separate and never accepted here. No key is
ever logged or echoed.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import ErrorCode, GatewayError, error_response


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
    return None


def key_matches(given: bytes | None, keys: tuple[bytes, ...]) -> bool:
    """Constant time in the given key: every configured key is compared."""
    if given is None:
        return False
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given, key)
    return matched


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, *, keys: tuple[bytes, ...], protect_health: bool, protect_metrics: bool) -> None:
        self.app = app
        self.keys = keys
        self.protected = ["/v1/"]
        if protect_health:
            self.protected += ["/health", "/ready"]
        if protect_metrics:
            self.protected += ["/metrics"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.keys and any(scope["path"].startswith(p) for p in self.protected):
            if not key_matches(bearer_token(scope["headers"]), self.keys):
                error = GatewayError(
                    ErrorCode.UNAUTHORIZED,
                    "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)
