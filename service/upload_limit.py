"""Body size caps on every path, enforced while the body streams in.

Checking `UploadFile.size` after the form is parsed would mean the whole upload
was already received (and spooled to disk); this middleware refuses a declared
Content-Length over the cap at once, and counts bytes as they arrive for
chunked bodies, answering 413 as soon as the cap is passed.

Every path is capped, not only the transcription route: a route that takes no
upload (or one whose handler refuses before reading, like an unauthenticated
admin call) must not be a way to make the server receive an unbounded body.
Routes that take audio (`UPLOAD_PATHS`) get `audio.max_upload_bytes`; every
other path gets the small `server.max_body_bytes`.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ErrorCode, GatewayError, error_response

#: Multipart framing around the file (boundaries, part headers, other fields).
FORM_OVERHEAD_BYTES = 64 * 1024
#: Paths (prefixes) whose body carries audio: the transcription routes and the admin clip upload.
UPLOAD_PATHS = ("/v1/audio/", "/admin/qualify")


class UploadTooLarge(HTTPException):
    """An HTTPException so that FastAPI's body parsing lets it through to the error table."""

    def __init__(self, max_bytes: int, setting: str) -> None:
        super().__init__(413, f"The request body exceeds the size cap of {max_bytes} bytes ({setting}).")


class UploadLimitMiddleware:
    """Caps every request body: `max_upload_bytes` on `UPLOAD_PATHS`, `max_body_bytes` elsewhere."""

    def __init__(self, app: ASGIApp, *, max_upload_bytes: int, max_body_bytes: int) -> None:
        self.app = app
        self.max_upload_bytes = max_upload_bytes
        self.max_body_bytes = max_body_bytes

    def _cap(self, path: str) -> tuple[int, int, str]:
        """(the advertised cap, the bytes actually allowed, the setting that sets it) for a path."""
        if path.startswith(UPLOAD_PATHS):
            return self.max_upload_bytes, self.max_upload_bytes + FORM_OVERHEAD_BYTES, "audio.max_upload_bytes"
        return self.max_body_bytes, self.max_body_bytes, "server.max_body_bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        advertised, limit, setting = self._cap(scope["path"])
        param = "file" if scope["path"].startswith(UPLOAD_PATHS) else None

        def refusal() -> GatewayError:
            return GatewayError(ErrorCode.UPLOAD_TOO_LARGE, UploadTooLarge(advertised, setting).detail, param=param)

        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await error_response(refusal())(scope, receive, send)
            return
        received = 0
        response_started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise UploadTooLarge(advertised, setting)
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
                await error_response(refusal())(scope, receive, send)
