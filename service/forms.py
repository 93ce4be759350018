"""Limits on parsing a multipart form, named per route.

FastAPI parses the form of a route that declares `File`/`Form` parameters
before anything else runs (authentication included), with Starlette's loose
defaults (1000 files, 1000 fields, 1 MiB per text part). A route that takes
`Request` instead parses the form itself, when it chooses and with these
limits; the body's total size is capped by `UploadLimitMiddleware` whatever
the form holds. Beyond a limit Starlette raises a 400, which the error table
answers as `invalid_request`.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette._utils import AwaitableOrContextManager
from starlette.datastructures import FormData
from starlette.requests import Request


@dataclass(frozen=True)
class FormLimits:
    """How many file parts and fields a form may have, and how large one text part may be."""

    max_files: int
    max_fields: int
    max_part_bytes: int

    async def parse(self, request: Request) -> FormData:
        """The request's form, parsed within these limits (Starlette caches it on the request and closes its files)."""
        return await self.form(request)

    def form(self, request: Request) -> AwaitableOrContextManager[FormData]:
        """The same, usable as `async with` so that the spooled files are closed as soon as the caller is done."""
        return request.form(max_files=self.max_files, max_fields=self.max_fields, max_part_size=self.max_part_bytes)


#: POST /admin/qualify: one optional `clip` file.
ADMIN_CLIP_FORM = FormLimits(max_files=1, max_fields=8, max_part_bytes=64 * 1024)
#: POST /v1/audio/transcriptions: one `file`; the OpenAI fields, `chunking_strategy[...]` and
#: `timestamp_granularities[]` entries; text parts large enough for a 4000-character prompt in UTF-8.
TRANSCRIPTION_FORM = FormLimits(max_files=1, max_fields=32, max_part_bytes=64 * 1024)
