"""Backpressure: a bounded number of transcriptions at once, and a bounded queue.

A request takes a slot before its upload is read into memory and keeps it until
its response is done, so memory stays bounded however many uploads arrive.
Requests beyond the slots wait in a bounded queue; beyond the queue, or after
waiting too long, they get 429 with Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from service.errors import ErrorCode, GatewayError
from service.metrics import GatewayMetrics


class AdmissionController:
    def __init__(
        self, *, max_concurrent: int, max_queued: int, queue_timeout_s: float, retry_after_s: int, metrics: GatewayMetrics
    ) -> None:
        self._slots = asyncio.Semaphore(max_concurrent)
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        self._metrics = metrics
        self.waiting = 0
        self.active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def _refuse(self, why: str) -> GatewayError:
        return GatewayError(
            ErrorCode.RATE_LIMITED,
            f"The gateway is at capacity ({self.max_concurrent} transcriptions running, {self.waiting} waiting): "
            f"{why}. Retry after {self.retry_after_s} s.",
            headers={"Retry-After": str(self.retry_after_s)},
        )

    async def acquire(self) -> None:
        if self._slots.locked() and self.waiting >= self.max_queued:
            raise self._refuse("the waiting queue is full")
        self.waiting += 1
        self._metrics.queued.set(self.waiting)
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout=self.queue_timeout_s)
        except TimeoutError:
            raise self._refuse(f"no slot freed within {self.queue_timeout_s:g} s") from None
        finally:
            self.waiting -= 1
            self._metrics.queued.set(self.waiting)
        self.active += 1
        self._idle.clear()

    def release(self) -> None:
        self.active -= 1
        self._slots.release()
        if self.active == 0:
            self._idle.set()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()

    async def wait_idle(self, timeout: float) -> bool:
        """Until no request holds a slot, or the timeout; True when idle."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=timeout)
        except TimeoutError:
            return False
        return True
