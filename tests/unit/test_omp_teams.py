"""tools/omp_teams.py: every renderer thread gets its own OpenMP team unless torch runs one thread."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

TOOL = Path(__file__).resolve().parents[2] / "tools" / "omp_teams.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("omp_teams", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_torch_thread_keeps_the_extractors_from_starting_teams() -> None:
    tool = _tool()
    workers = 4
    default, single = tool.measure(0, workers, 8), tool.measure(1, workers, 8)
    assert single["torch_threads"] == 1
    # one thread: the main thread, the workers and at most one more (no OpenMP team)
    assert single["os_threads"] <= workers + 2
    if (os.cpu_count() or 1) > 1:  # torch's default is one thread per CPU: every worker that ran adds a team
        assert default["torch_threads"] > 1 and default["os_threads"] > single["os_threads"]
