"""Fixtures shared by the unit tests: an app on the fake engine."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeEngine
from fastapi.testclient import TestClient
from helpers import AppFactory, open_gate, wait_ready

from service.app import create_app
from service.settings import GatewaySettings
from service.state import GatewayState


@pytest.fixture
def fake_client(tmp_path: Path) -> Iterator[AppFactory]:
    """Build a TestClient on a FakeEngine; `qualified=False` leaves the gate closed."""
    clients: list[TestClient] = []

    def build(engine: FakeEngine | None = None, *, qualified: bool = True, **settings: Any) -> tuple[TestClient, FakeEngine]:
        engine = engine or FakeEngine()
        config = GatewaySettings(state_dir=tmp_path / "state", **settings)
        app = create_app(config, engine_factory=lambda _: engine, on_ready=open_gate if qualified else _noop)
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        if qualified:
            wait_ready(client)
        else:
            deadline = time.monotonic() + 10
            while not engine.started and time.monotonic() < deadline:
                time.sleep(0.01)
        return client, engine

    yield build
    for client in clients:
        client.__exit__(None, None, None)


async def _noop(_: GatewayState) -> None:
    return None
