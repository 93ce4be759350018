"""Backpressure: a bounded number of transcriptions at once, and a bounded queue.

A request takes a slot before its upload is read into memory and keeps it until
its response is done, so memory stays bounded however many uploads arrive.
Requests beyond the slots wait in a bounded queue; beyond the queue, or after
waiting too long, they get 429 with Retry-After.

The slots belong to the service, not to a process: with several front-end
processes (service/frontends.py) they are counted in shared memory
(`SharedSlots`), so `limits.max_concurrent_requests` bounds the whole service
whichever process accepted the connection. One process alone uses an asyncio
semaphore (`LocalSlots`), which also keeps waiters in arrival order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from multiprocessing.context import BaseContext
from typing import Protocol

from service.errors import ErrorCode, GatewayError
from service.metrics import GatewayMetrics

#: How often a waiter looks for a slot freed by another front-end process (no cross-process wake-up).
SHARED_POLL_S = 0.005


class SlotPool(Protocol):
    """The transcription slots and the waiting queue, as the controller uses them."""

    capacity: int

    def enqueue(self, max_queued: int) -> bool:
        """Join the waiting line; False when every slot is taken and the line is full."""
        ...

    def dequeue(self) -> None:
        """Leave the waiting line (with or without a slot)."""
        ...

    async def take(self, timeout_s: float) -> bool:
        """A slot within `timeout_s`, or False."""
        ...

    def give(self) -> None:
        """Return a slot."""
        ...


class LocalSlots:
    """The slots of one process: an asyncio semaphore, first come first served."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._semaphore = asyncio.Semaphore(capacity)
        self._queued = 0

    def enqueue(self, max_queued: int) -> bool:
        if self._semaphore.locked() and self._queued >= max_queued:
            return False
        self._queued += 1
        return True

    def dequeue(self) -> None:
        self._queued -= 1

    async def take(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._semaphore.acquire(), timeout=timeout_s)
        except TimeoutError:
            return False
        return True

    def give(self) -> None:
        self._semaphore.release()


class SharedSlots:
    """Slots shared by the front-end processes of one service: two counters in shared memory, one lock.

    Created by the parent process and handed to each front end when it is
    spawned (multiprocessing shares the memory and the lock that way). Each
    operation holds the lock for a few instructions. A waiter cannot be woken
    by another process's release, so it looks again every `SHARED_POLL_S`;
    waiters are served in no particular order. The parent makes new counters
    whenever it restarts its front ends, so a process that died holding slots
    cannot leak them.
    """

    _TAKEN, _QUEUED = 0, 1

    def __init__(self, capacity: int, context: BaseContext) -> None:
        self.capacity = capacity
        self._lock = context.Lock()
        self._counts = context.RawArray("q", 2)

    def enqueue(self, max_queued: int) -> bool:
        with self._lock:
            if self._counts[self._TAKEN] >= self.capacity and self._counts[self._QUEUED] >= max_queued:
                return False
            self._counts[self._QUEUED] += 1
            return True

    def dequeue(self) -> None:
        with self._lock:
            self._counts[self._QUEUED] -= 1

    def _try_take(self) -> bool:
        with self._lock:
            if self._counts[self._TAKEN] < self.capacity:
                self._counts[self._TAKEN] += 1
                return True
            return False

    async def take(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self._try_take():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(SHARED_POLL_S, left))
        return True

    def give(self) -> None:
        with self._lock:
            self._counts[self._TAKEN] -= 1

    def counts(self) -> tuple[int, int]:
        """(slots taken, requests waiting) across every front-end process."""
        with self._lock:
            return int(self._counts[self._TAKEN]), int(self._counts[self._QUEUED])


class AdmissionController:
    """Admission of this process's requests into the service's slots; `active` and `waiting` are this process's."""

    def __init__(
        self,
        *,
        slots: SlotPool,
        max_queued: int,
        queue_timeout_s: float,
        retry_after_s: int,
        metrics: GatewayMetrics,
    ) -> None:
        self._slots = slots
        self.max_concurrent = slots.capacity
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
            f"The gateway is at capacity ({self.max_concurrent} transcriptions at once): "
            f"{why}. Retry after {self.retry_after_s} s.",
            headers={"Retry-After": str(self.retry_after_s)},
        )

    async def acquire(self) -> None:
        if not self._slots.enqueue(self.max_queued):
            raise self._refuse("the waiting queue is full")
        self.waiting += 1
        self._metrics.queued.set(self.waiting)
        try:
            if not await self._slots.take(self.queue_timeout_s):
                raise self._refuse(f"no slot freed within {self.queue_timeout_s:g} s")
        finally:
            self._slots.dequeue()
            self.waiting -= 1
            self._metrics.queued.set(self.waiting)
        self.active += 1
        self._idle.clear()

    def release(self) -> None:
        self.active -= 1
        self._slots.give()
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
        """Until no request of this process holds a slot, or the timeout; True when idle."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=timeout)
        except TimeoutError:
            return False
        return True
