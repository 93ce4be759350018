"""tools/frontend_spread.py against a stand-in server that answers /health as a front end does."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from types import ModuleType

TOOL = Path(__file__).resolve().parents[2] / "tools" / "frontend_spread.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("frontend_spread", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_a_burst_counts_each_connection_under_the_front_end_that_answered_it() -> None:
    accepted = 0

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        index, accepted = accepted % 3, accepted + 1  # as if the connections were spread over 3 front ends
        await reader.readuntil(b"\r\n\r\n")
        body = json.dumps({"status": "alive", "frontend": {"index": index, "count": 3}}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        counts = await _tool().burst("127.0.0.1", port, 10)
    finally:
        server.close()
    assert counts == {0: 4, 1: 3, 2: 3}
