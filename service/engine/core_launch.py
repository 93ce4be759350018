"""One engine core (or one per data-parallel rank) and N API processes, launched the way `vllm serve` does.

`vllm serve --api-server-count N` starts the engine core processes first, then N
API processes, each an `AsyncLLM` client of those cores over ZeroMQ sockets, all
accepting on one listening socket. This module drives exactly that machinery
(`launch_core_engines` and `APIServerProcessManager`, which takes the function
each API process runs), so the gateway's front ends are vLLM's own mechanism,
not a home-made RPC.

Two vLLM releases matter here, and their launch calls differ: 0.32 (the
project's pin, CPU and CUDA) binds the client listeners in the parent before the
cores start; 0.26 (the GPU benchmark host's, shared/facts/bench-host.md) lets
each API process bind and report its address back. Both are handled below,
chosen by what the installed vLLM provides; the API processes' side is the
same for both (`AsyncLLM.from_vllm_config(client_addresses=...)`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: What each API process runs: (listen_address, sock, args, client_config).
FrontendTarget = Callable[[str, socket.socket, Any, dict[str, Any]], None]


@dataclass
class LaunchedEngine:
    """The processes of one launch: the API processes, the engine cores and the DP coordinator (if any).

    `listeners` (vLLM 0.32: the `EngineZmqListeners` the parent bound for the API
    processes' sockets; None on 0.26) is held for as long as the group runs. Why:
    that object unlinks its IPC socket files when it is garbage collected, and the
    engine cores dial those paths from their own threads, possibly after the
    launch returned. Dropped with the launch function's frame, it removed the
    files under a core that had not connected yet, which then retried a missing
    path forever: a front end's requests reached the core, its answers never came
    back (the "first identity questions unanswered" start-ups). `vllm serve`
    keeps the same object alive for the server's whole life.
    """

    frontends: Any  # vllm.v1.utils.APIServerProcessManager
    engine_manager: Any
    coordinator: Any
    listeners: Any = None

    def processes(self) -> list[Any]:
        """Every process of the launch whose exit ends it (vLLM's own process objects)."""
        procs = list(self.frontends.processes)
        if self.engine_manager is not None:
            procs.extend(self.engine_manager.processes)
        if self.coordinator is not None:
            procs.append(self.coordinator.proc)
        return procs

    def shutdown(self, timeout: float | None) -> None:
        """API processes first (they drain within `timeout`), then the cores, then the coordinator."""
        self.frontends.shutdown(timeout=timeout)
        if self.engine_manager is not None:
            self.engine_manager.shutdown(timeout=timeout)
        if self.coordinator is not None:
            self.coordinator.shutdown(timeout=timeout)
        if self.listeners is not None:
            # The socket files, now that nothing dials them; and the object let go here, so that its own
            # finalizer does not run again at interpreter exit, when the modules it needs are gone.
            listeners, self.listeners = self.listeners, None
            listeners.cleanup()


def launch(
    vllm_config: Any,
    *,
    count: int,
    target: FrontendTarget,
    listen_address: str,
    sock: socket.socket,
    args: Any,
) -> LaunchedEngine:
    """Start the engine cores and `count` API processes running `target`; returns once the cores are up.

    vLLM is imported here, not at the top: the gateway's command line must not
    pay for importing it when it only transcribes through a server.
    """
    import vllm.v1.engine.utils as engine_utils
    from vllm.v1.executor import Executor

    executor_class = Executor.get_class(vllm_config)
    log_stats = True
    start = _launch_with_bound_listeners if hasattr(engine_utils, "bind_engine_zmq_listeners") else _launch_with_reported_addresses
    return start(engine_utils, vllm_config, executor_class, log_stats, count, target, listen_address, sock, args)


def _launch_with_bound_listeners(
    engine_utils: Any, vllm_config: Any, executor_class: Any, log_stats: bool, count: int,
    target: FrontendTarget, listen_address: str, sock: socket.socket, args: Any,
) -> LaunchedEngine:
    """vLLM 0.32: the parent binds every client listener, then starts the cores and the API processes."""
    from vllm.v1.utils import APIServerProcessManager

    listeners = engine_utils.bind_engine_zmq_listeners(vllm_config, count)
    with engine_utils.launch_core_engines(vllm_config, executor_class, log_stats, listeners.addresses) as started:
        coordinator = started.coordinator
        frontends = APIServerProcessManager(
            listen_address=listen_address,
            sock=sock,
            args=args,
            num_servers=count,
            input_listeners=listeners.inputs,
            output_listeners=listeners.outputs,
            target_server_fn=target,
            stats_update_address=coordinator.get_stats_publish_address() if coordinator else None,
            tensor_queue=started.tensor_queue,
        )
        started.watched_frontend_processes = frontends.processes
    return LaunchedEngine(frontends, started.engine_manager, coordinator, listeners=listeners)


def _launch_with_reported_addresses(
    engine_utils: Any, vllm_config: Any, executor_class: Any, log_stats: bool, count: int,
    target: FrontendTarget, listen_address: str, sock: socket.socket, args: Any,
) -> LaunchedEngine:
    """vLLM 0.26: each API process binds its sockets and reports them; the cores' handshake waits for them."""
    from vllm.v1.utils import APIServerProcessManager

    addresses = engine_utils.get_engine_zmq_addresses(vllm_config, count, defer_api_server_ports=True)
    with engine_utils.launch_core_engines(vllm_config, executor_class, log_stats, addresses, count) as (
        engine_manager, coordinator, addresses, tensor_queue,
    ):
        frontends = APIServerProcessManager(
            listen_address=listen_address,
            sock=sock,
            args=args,
            num_servers=count,
            input_addresses=addresses.inputs,
            output_addresses=addresses.outputs,
            target_server_fn=target,
            stats_update_address=coordinator.get_stats_publish_address() if coordinator else None,
            tensor_queue=tensor_queue,
        )
        addresses.inputs, addresses.outputs = frontends.gather_actual_addresses()
    return LaunchedEngine(frontends, engine_manager, coordinator)
