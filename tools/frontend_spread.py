"""How a burst of connections spreads over a gateway's front-end processes.

    .venv/bin/python tools/frontend_spread.py --url http://127.0.0.1:8000 [--connections 64] [--bursts 5]

Opens `--connections` keep-alive connections at once (all connected before any request is sent, as a
load generator's pool opens them), asks `GET /health` on each, and prints per burst how many landed on
each front end (`frontend.index` in the answer). The gateway must run with `server.api_processes` > 1.
docs/operations.md and service/frontends.py quote this tool's counts: with one socket shared by the
front ends a burst could land almost whole on one process; with one SO_REUSEPORT socket each, the
kernel spreads it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from urllib.parse import urlsplit


async def frontend_of(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """Which front end holds this connection: its /health answer says."""
    writer.write(b"GET /health HTTP/1.1\r\nHost: spread\r\n\r\n")
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    length = next(int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.lower().startswith("content-length:"))
    body = json.loads(await reader.readexactly(length))
    return int(body["frontend"]["index"])


async def burst(host: str, port: int, connections: int) -> Counter[int]:
    opened = await asyncio.gather(*(asyncio.open_connection(host, port) for _ in range(connections)))
    try:
        return Counter([await frontend_of(reader, writer) for reader, writer in opened])
    finally:
        for _, writer in opened:
            writer.close()


async def main_async(url: str, connections: int, bursts: int) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    for number in range(bursts):
        counts = await burst(host, port, connections)
        print(json.dumps({"burst": number, "connections": connections,
                          "per_frontend": {str(k): counts[k] for k in sorted(counts)}}), flush=True)
        await asyncio.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--bursts", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main_async(args.url, args.connections, args.bursts))


if __name__ == "__main__":
    main()
