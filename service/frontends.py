"""Several HTTP front-end processes on one engine core: the gateway's CPU spread over cores.

One process does everything on one event loop: HTTP parsing, multipart, audio
decode hand-offs, rendering, metrics, and vLLM's own output processing. At 16
and 64 concurrent streams that loop, not the GPU, limited the gateway
(docs/benchmarks.md). `server.api_processes=N` runs N front ends instead,
with vLLM's own mechanism for it (`vllm serve --api-server-count`): this parent
process launches the engine core(s) with `launch_core_engines`, and vLLM's
`APIServerProcessManager` spawns N processes that each run `run_frontend`: a
complete gateway app whose engine is an `AsyncLLM` client of that core, each
accepting on its own listening socket, all bound to the one port with
SO_REUSEPORT (`listening_sockets`). No RPC of our own.

What stays one thing for the service, and how:
- admission: the slots and the queue are counters in shared memory
  (`admission.SharedSlots`), made anew by each launch;
- `/metrics`: prometheus_client's multiprocess mode (the same directory vLLM's
  `setup_multiprocess_prometheus` makes), so any process renders all of them;
- the gate: one record store; each front end re-reads it when it changes
  (`gate.refresh_gate`, every `GATE_REFRESH_S` and on /ready), one qualification
  at a time through a file lock, its progress on a shared board (any process
  answers `GET /admin/qualify`); only the first front end qualifies at start-up;
- the ledger: one file, each process appending whole lines with one `write`
  on an `O_APPEND` descriptor (atomic with respect to the other writers);
- drain: SIGTERM or SIGINT to this parent stops the front ends with SIGTERM
  (each drains its own requests for `lifecycle.drain_timeout_s`), then the
  engine core; exit 0;
- restart: when any process of the group exits unexpectedly (the engine core,
  or a front end, which exits on purpose when its engine client dies), the
  whole group is stopped and launched again on the same listening sockets after
  the lifecycle's backoff; the gate opens again from the records for the new
  identity. After `lifecycle.restart_max_attempts` consecutive failures, or at
  the first with `lifecycle.restart_engine` off, the parent exits 1 so that an
  orchestrator replaces the replica. While the group restarts, connections wait
  in the listening sockets' backlogs (this parent holds the sockets throughout);
- connections: the kernel spreads them over the front ends' sockets by a hash of
  each connection's addresses. One socket shared by every process did not: a
  process woken for a new connection accepts every connection waiting (asyncio
  accepts up to the backlog at each wake-up), so a burst of connections went
  mostly to one process, whose event loop was then the queue: 64 at once over
  4 front ends, the busiest took 27-53 and the idlest 0-9 in 8 bursts, with a
  socket each 17-20 and 10-15 (tools/frontend_spread.py, 2-core dev machine,
  bench/results/cpu-smoke-2026-11-30/frontend_spread-*.jsonl); on the H200 the
  busiest of 4 front ends spent 3.3 times the CPU of the idlest.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import os
import signal
import socket
import time
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for_any
from types import FrameType
from typing import Any

import torch
from prometheus_client import multiprocess
from setproctitle import setproctitle

from service.admission import SharedSlots
from service.app import (
    ReadyHook,
    admission_slots,
    create_app,
    restart_delay_s,
    vllm_engine_factory,
)
from service.engine.core_launch import FrontendTarget, LaunchedEngine, launch
from service.engine.vllm_engine import FrontendClient, frontend_engine_args
from service.gate import open_gate_from_records, record_store_for, refresh_gate
from service.metrics import GatewayMetrics
from service.server import configure_logging, run_server
from service.settings import GatewaySettings
from service.state import EngineStatus, FrontendPosition, GatewayState

logger = logging.getLogger(__name__)

#: How often a front end re-reads the qualification records and checks its engine client.
GATE_REFRESH_S = 0.5
#: A group that served this long before failing counts as proven: the failure count starts over.
PROVEN_AFTER_S = 60.0
#: What vLLM's process manager adds to the engine client's addresses that `AsyncLLM` does not take.
NOT_CLIENT_ADDRESSES = ("client_count", "client_index", "api_server_loads")


@dataclass(frozen=True)
class FrontendArgs:
    """What every front-end process receives (pickled by vLLM's spawn of the process).

    `on_ready` opens the gate once the engine client is up: the records (and
    the start-up qualification) in the service; the benchmark passes its own
    (bench/gateway_mp.py). A module-level function, so that it pickles by name.
    """

    settings: GatewaySettings
    slots: SharedSlots
    #: The listening sockets (`listening_sockets`): front end i accepts on sockets[i], or all on the one.
    sockets: tuple[socket.socket, ...]
    on_ready: ReadyHook = open_gate_from_records

    def socket_for(self, index: int) -> socket.socket:
        """The listening socket of front end `index`."""
        return self.sockets[index % len(self.sockets)]


def frontend_client(client_config: dict[str, Any]) -> FrontendClient:
    """This API process's engine client place, from what vLLM's process manager handed it."""
    return FrontendClient(
        addresses={k: v for k, v in client_config.items() if k not in NOT_CLIENT_ADDRESSES},
        count=int(client_config["client_count"]),
        index=int(client_config["client_index"]),
    )


def run_frontend(listen_address: str, sock: socket.socket, args: FrontendArgs, client_config: dict[str, Any]) -> None:
    """One front-end process: a whole gateway app on its listening socket, its engine a client of the shared core.

    `sock` is the one socket vLLM's process manager hands every process; the front end's own is in `args`.
    """
    settings = args.settings
    configure_logging(settings.server.log_level)
    torch.set_num_threads(settings.server.frontend_torch_threads)  # the renderer's threads are the parallelism
    position = FrontendPosition(index=int(client_config["client_index"]), count=int(client_config["client_count"]),
                                torch_threads=torch.get_num_threads())
    setproctitle(f"moss-gateway::frontend-{position.index}")  # what ps and the operator see
    client = frontend_client(client_config)
    # The parent restarts the whole group; a front end never restarts its engine client by itself.
    own = settings.model_copy(update={"lifecycle": settings.lifecycle.model_copy(update={"restart_engine": False})})
    app = create_app(
        own,
        engine_factory=functools.partial(vllm_engine_factory, frontend=client),
        on_ready=args.on_ready,
        slots=args.slots,
        metrics=GatewayMetrics(multiprocess=True),
        frontend=position,
        watchers=(keep_in_step,),
    )
    logger.info("front end %d of %d serving on %s (pid %d)", position.index, position.count, listen_address, os.getpid())
    try:
        code = run_server(app, own, sockets=[args.socket_for(position.index)])
    finally:
        multiprocess.mark_process_dead(os.getpid())
    raise SystemExit(code)


async def keep_in_step(state: GatewayState) -> None:
    """Follow the shared gate; when this process's engine client is down, stop so that the parent restarts the group."""
    while True:
        await asyncio.sleep(GATE_REFRESH_S)
        refresh_gate(state)
        if state.engine_status in (EngineStatus.FAILED, EngineStatus.DEAD) and not state.shutting_down:
            logger.error("front end: the engine is %s (%s); stopping for a restart", state.engine_status.value, state.engine_error)
            signal.raise_signal(signal.SIGTERM)
            return


class FrontendSupervisor:
    """The parent: launches the engine core and the front ends, waits, restarts the group, stops it in order."""

    def __init__(
        self, settings: GatewaySettings, sockets: tuple[socket.socket, ...], on_ready: ReadyHook, target: FrontendTarget
    ) -> None:
        self.settings = settings
        self.sockets = sockets
        self.on_ready = on_ready
        self.target = target
        host, port = sockets[0].getsockname()[:2]
        self.listen_address = f"http://{host}:{port}"
        self.stopping = False
        self._wake_read, self._wake_write = os.pipe()
        self._launching = False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:
            return
        self.stopping = True
        logger.info("received signal %d: stopping the front ends, then the engine", signum)
        os.write(self._wake_write, b"x")
        if self._launching:
            raise SystemExit(128 + signum)  # abort a start-up in progress; vLLM's launch cleans up what it started

    def run(self) -> int:
        """Serve until stopped (0), or until the group cannot be kept up (1)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        lifecycle = self.settings.lifecycle
        failures = 0
        while True:
            started = time.monotonic()
            try:
                problem = self._serve_once()
            except SystemExit:
                return 0 if self.stopping else 1
            if problem is None:
                return 0
            failures = 1 if time.monotonic() - started >= PROVEN_AFTER_S else failures + 1
            if not lifecycle.restart_engine or failures >= lifecycle.restart_max_attempts:
                logger.error("front ends: giving up after %d consecutive failures; last: %s", failures, problem)
                return 1
            delay = restart_delay_s(lifecycle, failures)
            logger.warning("front ends: restarting the group in %g s (failure %d): %s", delay, failures, problem)
            if self._sleep_unless_stopped(delay):
                return 0

    def _serve_once(self) -> str | None:
        """One launch, served until a stop (None) or a failure (its description)."""
        self._launching = True
        try:
            group = self._launch()
        except Exception as exc:  # the engine failed to start: a failure like any other
            logger.exception("front ends: the launch failed")
            return f"launch failed: {type(exc).__name__}: {exc}"
        finally:
            self._launching = False
        try:
            return None if self.stopping else self._wait(group)
        finally:
            self._stop(group)

    def _launch(self) -> LaunchedEngine:
        settings = self.settings
        count = settings.server.api_processes
        engine_args = frontend_engine_args(vllm_engine_factory(settings).engine_args(), count=count, rank=-1)
        from vllm.usage.usage_lib import UsageContext  # the parent only: the front ends import vLLM themselves

        vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        slots = SharedSlots(admission_slots(settings), multiprocessing.get_context("spawn"))
        return launch(
            vllm_config,
            count=count,
            target=self.target,
            listen_address=self.listen_address,
            sock=self.sockets[0],
            args=FrontendArgs(settings=settings, slots=slots, sockets=self.sockets, on_ready=self.on_ready),
        )

    def _wait(self, group: LaunchedEngine) -> str | None:
        """Until a stop is asked (None) or a process of the group exits (what exited)."""
        processes = group.processes()
        by_sentinel = {process.sentinel: process for process in processes}
        ready = wait_for_any([*by_sentinel, self._wake_read])
        if self.stopping:
            return None
        exited = [by_sentinel[s] for s in ready if s in by_sentinel]
        for process in exited:
            process.join(timeout=1.0)  # the sentinel fires as the process ends; its exit code comes with the join
        return ", ".join(f"{p.name} (pid {p.pid}) exited with {p.exitcode}" for p in exited) or "woken without a cause"

    def _stop(self, group: LaunchedEngine) -> None:
        """Front ends first (each drains), then the engine core; mark the front ends' gauges dead."""
        lifecycle = self.settings.lifecycle
        timeout = lifecycle.drain_timeout_s + lifecycle.engine_shutdown_timeout_s + lifecycle.ledger_flush_timeout_s
        group.shutdown(timeout=timeout)
        for process in group.frontends.processes:
            if process.pid is not None:
                multiprocess.mark_process_dead(process.pid)

    def _sleep_unless_stopped(self, delay: float) -> bool:
        """Sleep `delay` seconds; True when a stop came meanwhile."""
        wait_for_any([self._wake_read], timeout=delay)
        return self.stopping


def listening_sockets(settings: GatewaySettings, count: int) -> tuple[socket.socket, ...]:
    """`count` listening sockets on `server.host:server.port`, bound with SO_REUSEPORT, one per front end.

    The kernel then hands each new connection to one socket by a hash of its addresses, so the front
    ends get even shares. Where SO_REUSEPORT does not exist, one socket, which every front end shares.
    The sockets are made here, in the parent, and held by it for its whole life: a connection that
    arrives while the group restarts waits in a backlog instead of being refused.
    """
    server = settings.server
    family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
    reuse_port = count > 1 and hasattr(socket, "SO_REUSEPORT")
    first = socket.create_server((server.host, server.port), family=family, backlog=server.backlog, reuse_port=reuse_port)
    if not reuse_port:
        return (first,)
    port = first.getsockname()[1]  # the port chosen, when the settings ask for any (0)
    rest = [
        socket.create_server((server.host, port), family=family, backlog=server.backlog, reuse_port=True)
        for _ in range(count - 1)
    ]
    return (first, *rest)


def serve_frontends(
    settings: GatewaySettings,
    *,
    on_ready: ReadyHook = open_gate_from_records,
    target: FrontendTarget = run_frontend,
    http_processes: int | None = None,
) -> int:
    """`moss-gateway serve` with `server.api_processes` > 1.

    `target` is what each of the API processes runs (vLLM's `target_server_fn`): the service's
    `run_frontend`; the benchmark passes one that makes the last process a direct engine client
    of the same core (bench/gateway_mp.py), so that the gateway and the bare engine are compared
    on one engine. `http_processes`: how many of the API processes accept connections (the first
    ones; default all), so that no listening socket is left without a process accepting on it.
    """
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        from vllm.v1.metrics.prometheus import setup_multiprocess_prometheus  # vLLM's own directory and clean-up

        setup_multiprocess_prometheus()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    record_store_for(settings)  # the sealing key is made (or checked) once, here, before any front end reads it
    sockets = listening_sockets(settings, settings.server.api_processes if http_processes is None else http_processes)
    try:
        return FrontendSupervisor(settings, sockets, on_ready, target).run()
    finally:
        for sock in sockets:
            sock.close()
