"""The request ledger: a line for every answered request (errors too), batched writes off the event loop."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeEngine
from fastapi.testclient import TestClient
from helpers import AppFactory, make_wav, open_gate
from starlette.types import Message, Receive, Scope, Send

from service.app import RequestLedgerMiddleware, create_app
from service.ledger import JsonLinesLedger, current_request_id
from service.settings import GatewaySettings

KEY = "ledger-test-api-key-0123"
ADMIN = "ledger-test-admin-token"


def ledger_lines(client: Any) -> list[dict[str, Any]]:
    ledger: JsonLinesLedger = client.app.state.gateway.request_ledger
    assert ledger.flush(timeout=10)
    return list(ledger.read())


def post(client: Any, headers: dict[str, str] | None = None, **fields: str) -> Any:
    return client.post(
        "/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(2.0), "audio/wav")}, data=fields,
        headers={"Authorization": f"Bearer {KEY}", **(headers or {})},
    )


# -- a line for every answer --------------------------------------------------------------------


def test_error_answers_leave_a_line_each_and_a_transcription_exactly_one(fake_client: AppFactory) -> None:
    client, engine = fake_client(
        FakeEngine(token_delay_s=0.0), access={"api_keys": [KEY]}, server={"admin_token": ADMIN},
        audio={"max_upload_bytes": 200_000},
    )
    answers = [
        post(client, {"Authorization": "Bearer wrong-key-wrong-key"}),  # 401
        client.post("/v1/audio/transcriptions", data={"model": "x"}, headers={"Authorization": f"Bearer {KEY}"}),
        post(client, response_format="nope"),  # 400
        client.post(  # 413
            "/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(30.0), "audio/wav")},
            headers={"Authorization": f"Bearer {KEY}"},
        ),
        client.get("/admin/qualify"),  # 401 on the admin routes
        client.get(f"/admin/evidence/trsc-{'0' * 32}", headers={"Authorization": f"Bearer {ADMIN}"}),  # 404
        post(client),  # 200: the pipeline's own line, and no second one
    ]
    statuses = [answer.status_code for answer in answers]
    assert statuses == [401, 400, 400, 413, 401, 404, 200], [a.text for a in answers]
    lines = ledger_lines(client)
    assert [line["status"] for line in lines] == statuses
    by_id = {line["request_id"]: line for line in lines}
    assert len(by_id) == len(lines)
    for answer in answers:
        line = by_id[answer.headers["x-request-id"]]  # every answer names its ledger line
        assert line["status"] == answer.status_code
        if answer.status_code >= 400:
            assert line["error_code"] == answer.json()["error"]["code"]
            assert line["path"] == answer.request.url.path and line["method"] == answer.request.method
            assert line["complete"] is True and line["time"] and line["duration_s"] >= 0
    assert lines[-1]["stop"]["stop"] == answers[-1].headers["x-moss-stop"]  # the pipeline's line: stop evidence
    body = json.dumps(lines)
    assert KEY not in body and ADMIN not in body and "wrong-key" not in body  # no secrets, no bodies
    assert len(engine.requests) == 1


def test_unqualified_and_overloaded_answers_are_in_the_ledger(fake_client: AppFactory) -> None:
    client, _ = fake_client(qualified=False)
    refused = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(2.0), "audio/wav")})
    assert refused.status_code == 503
    assert client.get("/health").status_code == 200  # not a ledgered route
    lines = ledger_lines(client)
    assert [(line["status"], line["error_code"]) for line in lines] == [(503, "backend_not_qualified")]


async def _drive(middleware: RequestLedgerMiddleware, path: str = "/v1/audio/transcriptions") -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "method": "POST", "path": path, "headers": []}
    with pytest.raises(BaseException):  # noqa: B017 - the app's own failure must pass through unchanged
        await middleware(scope, receive, send)
    return sent


def _middleware(tmp_path: Path, app: Any) -> tuple[RequestLedgerMiddleware, JsonLinesLedger]:
    gateway = create_app(GatewaySettings(state_dir=tmp_path / "state"), engine_factory=lambda _: FakeEngine())
    state = gateway.state.gateway
    return RequestLedgerMiddleware(app, state=state), state.request_ledger


def test_a_stream_cut_short_is_a_499_line(tmp_path: Path) -> None:
    """A slow reader dropped mid-stream (GeneratorExit, cancellation): headers went out, the body never ended."""

    async def streaming_app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-request-id", b"trsc-cut")]})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        raise asyncio.CancelledError

    middleware, ledger = _middleware(tmp_path, streaming_app)
    asyncio.run(_drive(middleware))
    assert ledger.flush(timeout=5)
    [line] = list(ledger.read())
    assert (line["request_id"], line["status"], line["http_status"], line["complete"]) == ("trsc-cut", 499, 200, False)


def test_an_unhandled_error_is_a_500_line(tmp_path: Path) -> None:
    async def failing_app(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    middleware, ledger = _middleware(tmp_path, failing_app)
    asyncio.run(_drive(middleware, "/admin/qualify"))
    assert ledger.flush(timeout=5)
    [line] = list(ledger.read())
    assert (line["status"], line["error_code"], line["http_status"], line["path"]) == (
        500, "engine_error", None, "/admin/qualify"
    )
    assert line["request_id"].startswith("trsc-")


def test_a_line_written_by_the_pipeline_replaces_the_layers_line(tmp_path: Path) -> None:
    """Whatever writes a line while the request is served (another task, a worker thread), the layer writes none."""
    seen_ids: list[str | None] = []

    async def accounting_app(scope: Scope, receive: Receive, send: Send) -> None:
        seen_ids.append(current_request_id())
        await asyncio.to_thread(ledger.submit, {"request_id": current_request_id(), "status": 200, "stop": "eos"})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    middleware, ledger = _middleware(tmp_path, accounting_app)

    async def run() -> list[Message]:
        sent: list[Message] = []

        async def send(message: Message) -> None:
            sent.append(message)

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        await middleware({"type": "http", "method": "POST", "path": "/v1/audio/x", "headers": []}, receive, send)
        return sent

    sent = asyncio.run(run())
    assert ledger.flush(timeout=5)
    lines = list(ledger.read())
    assert lines == [{"request_id": seen_ids[0], "status": 200, "stop": "eos"}]
    assert dict(sent[0]["headers"])[b"x-request-id"] == seen_ids[0].encode()  # type: ignore[union-attr]


# -- batched, off the event loop ------------------------------------------------------------------


def _count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the path of every fsynced descriptor (in order)."""
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_submit_batches_lines_into_few_fsyncs_and_keeps_every_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = JsonLinesLedger(tmp_path / "ledger" / "requests.jsonl")
    ledger.append({"seq": -1})  # the file exists: only the batches' fsyncs count below
    synced = _count_fsyncs(monkeypatch)
    for seq in range(500):
        ledger.submit({"seq": seq})
    assert ledger.flush(timeout=10)
    assert [line["seq"] for line in ledger.read()] == list(range(-1, 500))
    file_syncs = [path for path in synced if path.endswith("requests.jsonl")]
    assert 1 <= len(file_syncs) < 100, len(file_syncs)  # batches, not one fsync per line
    assert ledger.close(timeout=5)


def test_submit_never_waits_for_the_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = JsonLinesLedger(tmp_path / "requests.jsonl")
    release = threading.Event()
    real = os.fsync

    def slow_fsync(fd: int) -> None:
        release.wait(10)  # a disk that stalls
        real(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    started = time.monotonic()
    for seq in range(50):
        ledger.submit({"seq": seq})
    assert time.monotonic() - started < 0.5
    assert not ledger.flush(timeout=0.2)  # still stalled: nothing acknowledged yet
    release.set()
    assert ledger.flush(timeout=10)
    assert [line["seq"] for line in ledger.read()] == list(range(50))
    assert ledger.close(timeout=5)


def test_a_full_queue_makes_submit_wait_for_the_disk_rather_than_lose_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = JsonLinesLedger(tmp_path / "requests.jsonl", max_queued=2)
    ledger.append({"seq": -1})  # the file exists
    entered, release = threading.Event(), threading.Event()
    real = os.fsync

    def writer_stalls(fd: int) -> None:
        if threading.current_thread().name == "ledger-writer":
            entered.set()
            release.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fsync", writer_stalls)
    ledger.submit({"seq": 0})
    assert entered.wait(5)  # the writer holds line 0 in its stalled batch
    ledger.submit({"seq": 1})
    ledger.submit({"seq": 2})  # the queue (2 lines) is now full
    overflow = threading.Thread(target=lambda: [ledger.submit({"seq": seq}) for seq in (3, 4)])
    overflow.start()
    overflow.join(timeout=0.3)
    assert overflow.is_alive(), "a full queue dropped or queued lines beyond its bound instead of waiting"
    release.set()
    overflow.join(timeout=10)
    assert not overflow.is_alive()
    assert ledger.written_inline >= 1  # line 3 at least (line 4 may find room once the writer resumed)
    assert ledger.close(timeout=10)
    assert sorted(line["seq"] for line in ledger.read()) == list(range(-1, 5))


def test_close_flushes_and_a_later_submit_still_lands(tmp_path: Path) -> None:
    ledger = JsonLinesLedger(tmp_path / "requests.jsonl")
    for seq in range(20):
        ledger.submit({"seq": seq})
    assert ledger.close(timeout=10)
    assert len(list(ledger.read())) == 20
    ledger.submit({"seq": 20})  # e.g. a request aborted after the shutdown closed the ledger
    assert [line["seq"] for line in ledger.read()][-1] == 20


def test_the_directory_is_fsynced_after_the_ledger_file_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = _count_fsyncs(monkeypatch)
    path = tmp_path / "state" / "ledger" / "requests.jsonl"
    JsonLinesLedger(path).append({"seq": 0})
    assert str(path.parent) in synced, synced  # the new file's directory entry
    assert str(path.parent.parent) in synced  # and the new ledger directory's entry in the state dir
    assert synced.index(str(path.parent)) < synced.index(str(path))  # before the line counts as written
    synced.clear()
    JsonLinesLedger(path).append({"seq": 1})
    assert synced == [str(path)]  # an existing file: only the file


def test_shutdown_flushes_lines_still_queued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's shutdown closes the ledger: a line accepted just before the stop is on disk after it."""
    settings = GatewaySettings(state_dir=tmp_path / "state")
    app = create_app(settings, engine_factory=lambda _: FakeEngine(), on_ready=open_gate)
    with TestClient(app) as client:
        ledger: JsonLinesLedger = app.state.gateway.request_ledger
        release = threading.Event()
        real = os.fsync

        def writer_stalls(fd: int) -> None:
            if threading.current_thread().name == "ledger-writer":
                release.wait(0.5)  # the disk is slow when the stop comes
            real(fd)

        monkeypatch.setattr(os, "fsync", writer_stalls)
        assert client.get("/admin/qualify").status_code == 401
    lines = list(JsonLinesLedger(tmp_path / "state" / "ledger" / "requests.jsonl").read())
    assert [(line["status"], line["path"]) for line in lines] == [(401, "/admin/qualify")]
    assert ledger.flush(timeout=0)  # nothing left queued
