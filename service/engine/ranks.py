"""Reaching every data-parallel rank of a vLLM engine.

vLLM's `collective_rpc` on a data-parallel front end sends the call to every
rank's engine core but returns the first rank's answer only (vLLM 0.26 and 0.32,
`DPLBAsyncMPClient.call_utility_async`). The backend identity needs each rank's
devices, so the call is sent to each rank's engine core on its own, through the
same client-side utility call vLLM uses, addressed to that core's identity.
`core_engines` is in rank order in both versions; without data parallelism it
holds the one core.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def rpc_each_rank(engine_core: Any, method: str, *, timeout: float) -> list[list[Any]]:
    """`collective_rpc(method)` on each rank's engine core: per rank, the answers of its workers."""
    cores = list(engine_core.core_engines)
    calls = (
        engine_core._call_utility_async("collective_rpc", method, timeout, (), None, engine=core) for core in cores
    )
    answers = await asyncio.gather(*calls)
    return [list(answer) for answer in answers]
