"""API keys for /v1/* (and optionally /health, /ready, /metrics).

Keys are compared in constant time against every configured key. The admin
token (service/api/admin.py) is accepted here too, so that admin-only request
fields can be used with it, but an API key never opens an admin route. No key
is ever logged or echoed.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import ErrorCode, GatewayError, error_response


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header; None when absent or empty (a bare `Bearer`)."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
    return None


def key_matches(given: bytes | None, keys: tuple[bytes, ...]) -> bool:
    """Constant time in the given key: every configured key is compared.

    An empty presented token never matches, nor does an empty configured key, even
    though the settings already refuse empty secrets: the comparison must not
    depend on the configuration being valid to stay closed.
    """
    if not given:
        return False
    matched = False
    for key in keys:
        matched |= bool(key) and hmac.compare_digest(given, key)
    return matched


class ApiKeyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: tuple[bytes, ...],
        protect_health: bool,
        protect_metrics: bool,
        extra_keys: tuple[bytes, ...] = (),
    ) -> None:
        self.app = app
        self.keys = keys
        self.accepted = keys + extra_keys
        self.protected = ["/v1/"]
        if protect_health:
            self.protected += ["/health", "/ready"]
        if protect_metrics:
            self.protected += ["/metrics"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.keys and any(scope["path"].startswith(p) for p in self.protected):
            if not key_matches(bearer_token(scope["headers"]), self.accepted):
                error = GatewayError(
                    ErrorCode.UNAUTHORIZED,
                    "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)
