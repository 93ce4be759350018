"""The upload size cap, enforced while the body streams in.

Checking `UploadFile.size` after the form is parsed would mean the whole upload
was already received (and spooled); this middleware refuses a declared
Content-Length over the cap at once, and counts bytes as they arrive for
chunked uploads, answering 413 as soon as the cap is passed.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ErrorCode, GatewayError, error_response

#: Multipart framing around the file (boundaries, part headers, other fields).
FORM_OVERHEAD_BYTES = 64 * 1024


class UploadTooLarge(HTTPException):
    """An HTTPException so that FastAPI's body parsing lets it through to the error table."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(
            413, f"The upload exceeds the size cap of {max_bytes} bytes (audio.max_upload_bytes)."
        )


class UploadLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_bytes: int, path_prefix: str = "/v1/audio/") -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.limit = max_bytes + FORM_OVERHEAD_BYTES
        self.path_prefix = path_prefix

    def _error(self) -> GatewayError:
        return GatewayError(ErrorCode.UPLOAD_TOO_LARGE, UploadTooLarge(self.max_bytes).detail, param="file")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.path_prefix):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await error_response(self._error())(scope, receive, send)
            return
        received = 0
        response_started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise UploadTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except UploadTooLarge:
            if not response_started:
                await error_response(self._error())(scope, receive, send)
