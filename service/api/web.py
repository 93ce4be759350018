"""The web page at `/` and its two assets, read from the `service.web` package.

Why the gateway serves its own page: a person who starts `./scripts/serve` should
be able to drop a recording into a browser and see speakers, timestamps and the
stop evidence without curl. The page talks to the same public API as any client
(`/v1/audio/transcriptions` streamed, `/v1/backend`, `/ready`), so it needs no
routes of its own beyond the files. Those routes stay open when API keys are
set (the page asks for the key and sends it with each API call), and a strict
Content-Security-Policy keeps the page to its own origin: no CDN, works offline.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

from service.errors import ErrorCode, GatewayError

router = APIRouter(include_in_schema=False)

#: The only files served under /ui/, with their media types.
ASSETS: dict[str, str] = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
_PAGE = "index.html"

#: Everything from this origin only; audio plays from the uploaded file's blob URL.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "media-src 'self' blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Small files that change with the package: revalidate rather than serve a stale page after an upgrade.
    "Cache-Control": "no-cache",
}


@cache
def asset_bytes(name: str) -> bytes:
    """One asset's bytes, read once from the installed package."""
    return files("service.web").joinpath(name).read_bytes()


@router.get("/")
async def page() -> Response:
    """The transcription page."""
    return Response(asset_bytes(_PAGE), media_type="text/html; charset=utf-8", headers=_HEADERS)


@router.get("/ui/{name}")
async def asset(name: str) -> Response:
    """The page's script and style sheet; any other name is a 404 in the API's error envelope."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise GatewayError(ErrorCode.NOT_FOUND, f"No page asset named '{name}'.")
    return Response(asset_bytes(name), media_type=media_type, headers=_HEADERS)
