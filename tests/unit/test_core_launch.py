"""service/engine/core_launch.py: the API processes' socket files outlive the launch call (vLLM 0.32's path).

Regression: the parent's `EngineZmqListeners` was a local of the launch function;
garbage collected when it returned, it unlinked the IPC socket files, and an
engine core that had not dialled them yet never reached the front ends (their
first identity questions went unanswered). The engine cores and API processes
are stand-ins here: the listeners, their files and their cleanup are vLLM's own.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from service.engine import core_launch

pytest.importorskip("vllm")
zmq = pytest.importorskip("zmq")


class FakeProcessManager:
    """Stands in for vLLM's APIServerProcessManager: starts nothing, and closes the listeners' fds as it does."""

    def __init__(self, *, input_listeners: list[Any], output_listeners: list[Any], **_: Any) -> None:
        for listener in (*input_listeners, *output_listeners):
            listener.close()  # what vLLM's manager does once a process has inherited it
        self.processes: list[Any] = []
        self.stopped = False

    def shutdown(self, timeout: float | None = None) -> None:
        self.stopped = True


def _engine_utils(tmp_path: Path, count: int) -> Any:
    """vLLM's own listener binding on paths under `tmp_path`, and a core launch that starts nothing."""
    from vllm.utils.network_utils import make_zmq_listener
    from vllm.v1.engine.utils import EngineZmqListeners

    def bind(vllm_config: Any, num_api_servers: int) -> EngineZmqListeners:
        return EngineZmqListeners(
            inputs=[make_zmq_listener(f"ipc://{tmp_path}/in-{i}", zmq.ROUTER) for i in range(num_api_servers)],
            outputs=[make_zmq_listener(f"ipc://{tmp_path}/out-{i}", zmq.PULL) for i in range(num_api_servers)],
        )

    @contextlib.contextmanager
    def launch_core_engines(*_: Any) -> Iterator[Any]:
        yield SimpleNamespace(coordinator=None, engine_manager=None, tensor_queue=None, watched_frontend_processes=[])

    return SimpleNamespace(bind_engine_zmq_listeners=bind, launch_core_engines=launch_core_engines)


def test_the_socket_files_live_as_long_as_the_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.v1.utils

    monkeypatch.setattr(vllm.v1.utils, "APIServerProcessManager", FakeProcessManager)
    launched = core_launch._launch_with_bound_listeners(
        _engine_utils(tmp_path, 2), None, None, True, 2, lambda *a: None, "127.0.0.1:0", None, None
    )
    gc.collect()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["in-0", "in-1", "out-0", "out-1"], "the cores would dial paths that no longer exist"
    held = weakref.ref(launched.listeners)
    launched.shutdown(timeout=1.0)
    assert launched.frontends.stopped
    assert list(tmp_path.iterdir()) == []  # cleaned up once the group is down
    gc.collect()
    # Let go at shutdown: its finalizer ran then, not at interpreter exit, where it printed a traceback
    # into the log of a gateway stopped by SIGTERM (regression: test_frontends' drain test).
    assert held() is None
