"""The HTTP front: uvicorn configured from the settings, plus the header deadline uvicorn lacks.

uvicorn's defaults let one client hold the server: with httptools (its default
parser when installed) a request head has no size limit (a 60 MB header was
accepted and slowed another client's /health to 4 s), nothing bounds how long
a head may take to arrive, and connections are unlimited. So:
- the h11 parser, whose `max_incomplete_event_size` bounds the request line
  plus headers (`server.max_header_bytes`; beyond it: 400 and close);
- `HeaderDeadlineProtocol`: a connection must deliver a complete request head
  within `server.header_timeout_s` of connecting or of its previous response,
  or it is closed (uvicorn's keep-alive timer stops at the first byte);
- `limit_concurrency` from `server.max_connections` (uvicorn answers 503 to a
  request beyond it), `backlog`, `timeout_keep_alive`;
- the body's deadlines live in service/body_deadline.py (an ASGI middleware,
  installed by the app factory, so they hold under any server).
The transfer is h11's pure-Python parser: slower than httptools per request,
which is nothing next to a transcription.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from service.settings import GatewaySettings


class GatewayServerConfig(uvicorn.Config):
    """uvicorn's Config plus the header deadline its protocols read."""

    def __init__(self, app: ASGIApp, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.header_timeout_s = header_timeout_s


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol that closes a connection whose request head does not arrive in time.

    The deadline is armed when the connection opens and after each response,
    and disarmed when a request head has been parsed (a new request cycle).
    """

    def __init__(
        self,
        config: GatewayServerConfig,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.header_timeout_s = config.header_timeout_s
        self._head_deadline: asyncio.TimerHandle | None = None
        self._cycle_waited_after: object | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._head_deadline is not None and self.cycle is not self._cycle_waited_after:
            self._disarm_head_deadline()  # a new request's head was parsed

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_deadline()

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._cycle_waited_after = self.cycle
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            self.logger.warning("closing a connection whose request head did not arrive in %g s", self.header_timeout_s)
            self.transport.close()


def server_config(app: ASGIApp, settings: GatewaySettings, **overrides: Any) -> GatewayServerConfig:
    """The uvicorn configuration of the gateway: every limit from `settings.server`."""
    server = settings.server
    options: dict[str, Any] = {
        "host": server.host,
        "port": server.port,
        "log_level": server.log_level,
        "http": HeaderDeadlineProtocol,
        "h11_max_incomplete_event_size": server.max_header_bytes,
        "timeout_keep_alive": server.keep_alive_timeout_s,
        # uvicorn refuses when connections (its own included) or running requests reach the limit:
        # +1 so that exactly max_connections are served.
        "limit_concurrency": server.max_connections + 1,
        "backlog": server.backlog,
        # uvicorn drains open requests this long after SIGTERM; the lifespan then aborts what is left.
        "timeout_graceful_shutdown": int(settings.lifecycle.drain_timeout_s),
    }
    options.update(overrides)
    return GatewayServerConfig(app, header_timeout_s=server.header_timeout_s, **options)


#: The exit status when the app failed to start (its lifespan start-up raised).
STARTUP_FAILURE = 3


def configure_logging(level: str) -> None:
    """The gateway's log format on stderr, at `server.log_level`."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_server(
    app: FastAPI, settings: GatewaySettings, *, sockets: list[socket.socket] | None = None, **overrides: Any
) -> int:
    """Serve `app` until SIGTERM or SIGINT, then stop in order and return 0 (3 when the start-up failed).

    uvicorn catches the signal, stops accepting, drains open requests for
    `lifecycle.drain_timeout_s`, and runs the lifespan's shutdown (engine, then
    ledger). Two things are added around it:

    - the gateway learns of the signal at once, not after the drain, so that an
      engine core that got the same signal (a process-group or cgroup kill:
      Ctrl-C, systemd) is seen stopping, not dying, and is not restarted;
    - after an orderly stop uvicorn raises the signal again with the previous
      handler, which by default kills the process with the signal's status; the
      handler installed here makes that a clean exit 0 instead. A signal that
      arrives before uvicorn took over still stops the process at once.

    `sockets`: serve on these already listening sockets (a front-end process
    shares its parent's) instead of binding `server.host:server.port`.
    """
    state = app.state.gateway
    server = uvicorn.Server(server_config(app, settings, **overrides))
    uvicorn_handle_exit = server.handle_exit

    def handle_exit(signum: int, frame: FrameType | None) -> None:
        state.begin_shutdown()
        uvicorn_handle_exit(signum, frame)

    def after_orderly_stop(signum: int, frame: FrameType | None) -> None:
        if not server.should_exit:  # uvicorn never took the signal: nothing was drained, stop now
            raise SystemExit(128 + signum)

    # uvicorn installs `server.handle_exit` for SIGINT and SIGTERM while it serves, then restores these.
    server.handle_exit = handle_exit  # type: ignore[method-assign,assignment]
    previous = {sig: signal.signal(sig, after_orderly_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=sockets)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if server.started else STARTUP_FAILURE
