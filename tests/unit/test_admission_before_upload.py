"""Issue 12: an upload takes its admission slot before its body is read, so waiting uploads cannot pile up.

The app is called in its own event loop (the TestClient's portal) through httpx's ASGI transport, which
hands the body to the app only as the app asks for it: the count of chunks pulled is what the gateway read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
from fake_engine import FakeEngine
from helpers import AppFactory, make_wav

CHUNK = 16 * 1024


def multipart(data: bytes, boundary: str = "b0undary") -> bytes:
    return (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
        f"Content-Type: audio/wav\r\n\r\n"
    ).encode() + data + f"\r\n--{boundary}--\r\n".encode()


class CountingBody:
    """A request body that records how many of its chunks the server pulled."""

    def __init__(self, payload: bytes) -> None:
        self.chunks = [payload[i : i + CHUNK] for i in range(0, len(payload), CHUNK)]
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.pulled += 1
            yield chunk


def test_a_refused_upload_is_not_read_and_an_admitted_one_is(fake_client: AppFactory) -> None:
    client, engine = fake_client(FakeEngine(token_delay_s=0.02), limits={"max_concurrent_requests": 1, "max_queued_requests": 0})
    payload = multipart(make_wav(4.0))
    headers = {"Content-Type": "multipart/form-data; boundary=b0undary"}

    async def scenario() -> tuple[int, int, int, int]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            holder = CountingBody(payload)
            first = asyncio.create_task(http.post("/v1/audio/transcriptions", content=holder, headers=headers))
            while not engine.running:  # the first request holds the only slot and is generating
                await asyncio.sleep(0.01)
            refused_body = CountingBody(payload)
            refused = await http.post("/v1/audio/transcriptions", content=refused_body, headers=headers)
            admitted = await first
            return refused.status_code, refused_body.pulled, admitted.status_code, holder.pulled

    refused_status, refused_pulled, admitted_status, admitted_pulled = client.portal.call(scenario)
    assert admitted_status == 200 and admitted_pulled == len(CountingBody(payload).chunks)  # read whole once admitted
    assert refused_status == 429
    assert refused_pulled <= 1, f"the refused upload was read ({refused_pulled} chunks) before its slot was refused"
