"""The request body must arrive in time.

uvicorn bounds the wait for a request's headers (with service/server.py) and
the idle time between requests, but not the body: a body dripped a byte at a
time, or a Content-Length larger than what is sent, held a connection (and a
spooled upload) for as long as the client liked. This middleware wraps
`receive` so that a body must come in full within `total_timeout_s`, with no
silence longer than `idle_timeout_s`, and, once `idle_timeout_s` has passed, at
an average of at least `min_rate_bytes_s`. A body that misses a deadline is
answered 408 `request_body_timeout`.

The 408 carries `Connection: close`: the server stops reading a body it gave
up on. Other early answers (401, 413 sent before the body was read) keep
uvicorn's behaviour: the rest of the body is read and dropped, so the client
gets its answer instead of a reset, and the header deadline of
service/server.py closes the connection if that goes on past
`server.header_timeout_s`.
"""

from __future__ import annotations

import asyncio

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ErrorCode, GatewayError, error_response

CLOSE_HEADER = (b"connection", b"close")


class BodyTimeout(HTTPException):
    """An HTTPException so that FastAPI's body parsing lets it through to the error table."""

    def __init__(self, detail: str) -> None:
        super().__init__(408, detail)


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the request announces a body (a non-zero Content-Length, or any Transfer-Encoding)."""
    for name, value in headers:
        name = name.lower()
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


class BodyDeadlineMiddleware:
    """Deadlines on receiving a request body; the 408 that ends one closes the connection."""

    def __init__(self, app: ASGIApp, *, total_timeout_s: float, idle_timeout_s: float, min_rate_bytes_s: int) -> None:
        self.app = app
        self.total_timeout_s = total_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.min_rate_bytes_s = min_rate_bytes_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope["headers"]):
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        received = 0
        complete = False
        timed_out = False
        response_started = False

        def give_up(detail: str) -> BodyTimeout:
            nonlocal timed_out
            timed_out = True
            return BodyTimeout(detail)

        async def timed_receive() -> Message:
            nonlocal received, complete
            if complete:  # later calls only wait for a disconnect: no deadline on those
                return await receive()
            remaining = started + self.total_timeout_s - loop.time()
            wait = min(self.idle_timeout_s, remaining)
            if wait <= 0:
                raise give_up(f"The request body did not arrive within {self.total_timeout_s:g} s.")
            try:
                message = await asyncio.wait_for(receive(), wait)
            except TimeoutError:
                if wait < self.idle_timeout_s:
                    raise give_up(f"The request body did not arrive within {self.total_timeout_s:g} s.") from None
                raise give_up(f"No part of the request body arrived for {self.idle_timeout_s:g} s.") from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
                return message
            received += len(message.get("body", b""))
            elapsed = loop.time() - started
            if elapsed > self.idle_timeout_s and received < self.min_rate_bytes_s * elapsed:
                raise give_up(
                    f"The request body arrives slower than {self.min_rate_bytes_s} bytes per second "
                    f"({received} bytes in {elapsed:.0f} s)."
                )
            return message

        async def closing_send(message: Message) -> None:
            """The 408 (whoever renders it: this middleware or the app's error handler) closes the connection."""
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
                if timed_out:
                    message = {**message, "headers": [*message.get("headers", []), CLOSE_HEADER]}
            await send(message)

        try:
            await self.app(scope, timed_receive, closing_send)
        except BodyTimeout as timeout:
            if not response_started:
                error = GatewayError(ErrorCode.BODY_TIMEOUT, str(timeout.detail))
                await error_response(error)(scope, receive, closing_send)
