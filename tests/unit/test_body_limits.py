"""Every path under a body cap; admin authentication before any of the body is read.

Issue 12: an unauthenticated `POST /admin/qualify` with a 200 MB chunked body
was spooled whole to /tmp before the admin check ran (the form was parsed
first), the upload cap covered `/v1/audio/` only, and a clip named `..` gave 500.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from helpers import AppFactory, make_wav
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from service.api.admin import clip_file_name
from service.errors import GatewayError
from service.forms import TRANSCRIPTION_FORM, FormLimits

ADMIN = {"Authorization": "Bearer s3cret-admin-token-0123"}
BOUNDARY = "limitboundary"
CHUNK = 64 * 1024


class DrippedForm:
    """A chunked multipart body with one file part of `size` bytes; counts the chunks the server pulled."""

    def __init__(self, size: int, *, field: str = "clip", filename: str = "clip.wav") -> None:
        self.size = size
        self.field = field
        self.filename = filename
        self.pulled = 0

    @property
    def headers(self) -> dict[str, str]:
        return {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}

    def __iter__(self) -> Iterator[bytes]:
        self.pulled += 1
        yield (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{self.field}"; filename="{self.filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        for _ in range(self.size // CHUNK):
            self.pulled += 1
            yield b"\0" * CHUNK
        self.pulled += 1
        yield f"\r\n--{BOUNDARY}--\r\n".encode()


@pytest.mark.parametrize("token", ["s3cret-admin-token-0123", None], ids=["wrong-token", "admin-disabled"])
def test_unauthenticated_admin_upload_is_refused_before_its_body_is_read(
    fake_client: AppFactory, token: str | None
) -> None:
    client, _ = fake_client(server={"admin_token": token})
    body = DrippedForm(8 << 20)  # 8 MiB: far past Starlette's 1 MiB in-memory spool
    response = client.post("/admin/qualify", content=iter(body), headers={**body.headers, "Authorization": "Bearer no"})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    # The app never asked for the body (TestClient pulls the generator on the first receive):
    # the refusal came from the headers, nothing was parsed or spooled.
    assert body.pulled == 0, f"the server read {body.pulled} chunks of an unauthenticated body"
    assert client.app.state.gateway.qualification_task is None  # type: ignore[attr-defined]


def test_admin_clip_upload_is_under_the_upload_cap(fake_client: AppFactory) -> None:
    client, _ = fake_client(server={"admin_token": "s3cret-admin-token-0123"}, audio={"max_upload_bytes": 4096})
    body = DrippedForm(1 << 20)
    response = client.post("/admin/qualify", content=iter(body), headers={**body.headers, **ADMIN})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "upload_too_large"
    assert client.app.state.gateway.qualification_task is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("method", "path"), [("get", "/v1/models"), ("get", "/health"), ("post", "/admin/qualify")])
def test_declared_body_over_the_cap_is_refused_on_every_path(fake_client: AppFactory, method: str, path: str) -> None:
    client, _ = fake_client(server={"admin_token": "s3cret-admin-token-0123", "max_body_bytes": 1024}, audio={"max_upload_bytes": 8192})
    size = 8192 + 64 * 1024 + 1 if path.startswith("/admin/") else 1025
    response = client.request(method, path, content=b"x" * size, headers=ADMIN)
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "upload_too_large"


def test_bodies_within_the_caps_still_pass(fake_client: AppFactory) -> None:
    client, _ = fake_client(server={"max_body_bytes": 1024})
    assert client.request("get", "/health", content=b"x" * 1024).status_code == 200
    wav = make_wav(2.0)  # 64 KB, far above max_body_bytes: audio routes use audio.max_upload_bytes
    response = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav, "audio/wav")})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("name", ["..", ".", "sub/..", "a\\..", "x" * 256])
def test_clip_names_that_are_not_plain_file_names_are_400(fake_client: AppFactory, name: str) -> None:
    client, _ = fake_client(server={"admin_token": "s3cret-admin-token-0123"})
    response = client.post("/admin/qualify", files={"clip": (name, make_wav(1.0), "audio/wav")}, headers=ADMIN)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "clip"
    assert client.app.state.gateway.qualification_task is None  # type: ignore[attr-defined]


def test_clip_as_text_field_or_empty_file_is_400(fake_client: AppFactory) -> None:
    client, _ = fake_client(server={"admin_token": "s3cret-admin-token-0123"})
    text = client.post("/admin/qualify", data={"clip": "not a file"}, headers=ADMIN)
    empty = client.post("/admin/qualify", files={"clip": ("c.wav", b"", "audio/wav")}, headers=ADMIN)
    assert (text.status_code, empty.status_code) == (400, 400)
    assert empty.json()["error"]["code"] == "empty_file"


def test_clip_file_name_keeps_the_last_component() -> None:
    assert clip_file_name(None) == "clip.wav"
    assert clip_file_name("clips/two voices.wav") == "two voices.wav"
    assert clip_file_name("C:\\clips\\a.flac") == "a.flac"
    for bad in ("..", "x/", "\x00"):
        with pytest.raises(GatewayError):
            clip_file_name(bad)


def test_admin_form_takes_one_clip_only(fake_client: AppFactory) -> None:
    client, _ = fake_client(server={"admin_token": "s3cret-admin-token-0123"})
    two = [("clip", ("a.wav", make_wav(1.0), "audio/wav")), ("clip", ("b.wav", make_wav(1.0), "audio/wav"))]
    response = client.post("/admin/qualify", files=two, headers=ADMIN)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert client.app.state.gateway.qualification_task is None  # type: ignore[attr-defined]


def _form_app(limits: FormLimits) -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        form = await limits.parse(request)
        return JSONResponse(sorted(form.keys()))

    return Starlette(routes=[Route("/", echo, methods=["POST"])])


def test_transcription_form_limits_take_an_sdk_request_and_refuse_more() -> None:
    client = TestClient(_form_app(TRANSCRIPTION_FORM))
    sdk_fields = {
        "model": "m", "prompt": "p" * 4000, "response_format": "verbose_json", "temperature": "0",
        "timestamp_granularities[]": ["segment"], "chunking_strategy[type]": "server_vad",
        "chunking_strategy[threshold]": "0.5", "stream": "true", "max_completion_tokens": "100",
    }
    wav = {"file": ("a.wav", make_wav(1.0), "audio/wav")}
    assert client.post("/", data=sdk_fields, files=wav).status_code == 200
    two_files = [("file", ("a.wav", b"1", "audio/wav")), ("file", ("b.wav", b"2", "audio/wav"))]
    assert client.post("/", files=two_files).status_code == 400
    assert client.post("/", data={f"f{i}": "x" for i in range(40)}, files=wav).status_code == 400
    assert client.post("/", data={"prompt": "p" * (65 * 1024)}, files=wav).status_code == 400
