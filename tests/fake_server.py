"""A gateway on the fake engine in its own process, for shutdown and HTTP-front tests.

    python tests/fake_server.py --port P --state-dir D [--token-delay S] [--drain S] [--fingerprint HEX]
                                [--unqualified]

`--fingerprint` tells replicas apart behind a balancer (X-Moss-Backend-Fingerprint);
`--unqualified` leaves the gate closed (`/ready` 503, transcriptions 503).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from fake_engine import FakeEngine  # noqa: E402
from helpers import open_gate  # noqa: E402

from service.app import create_app  # noqa: E402
from service.server import run_server  # noqa: E402
from service.settings import GatewaySettings  # noqa: E402
from service.state import GatewayState  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--drain", type=float, default=30.0)
    parser.add_argument("--fingerprint", default=None)
    parser.add_argument("--unqualified", action="store_true")
    args = parser.parse_args()
    settings = GatewaySettings(
        state_dir=Path(args.state_dir),
        lifecycle={"drain_timeout_s": args.drain},
        server={"host": "127.0.0.1", "port": args.port, "log_level": "warning"},
    )
    engine = FakeEngine(token_delay_s=args.token_delay)
    fingerprint = args.fingerprint

    async def gate(state: GatewayState) -> None:
        if not args.unqualified:
            await open_gate(state)
        state.gate.fingerprint = fingerprint or state.gate.fingerprint or "0" * 64

    app = create_app(settings, engine_factory=lambda _: engine, on_ready=gate)
    # The gateway's own serve path (limits from MOSS_GATEWAY_SERVER__*, signals, drain, exit status), on the test's port.
    return run_server(app, settings, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    sys.exit(main())
