"""The admission slots shared by front-end processes (service/admission.py `SharedSlots`), across real processes."""

from __future__ import annotations

import asyncio
import multiprocessing
from multiprocessing.synchronize import Event

import pytest

from service.admission import AdmissionController, SharedSlots
from service.errors import GatewayError
from service.metrics import GatewayMetrics

SPAWN = multiprocessing.get_context("spawn")


def hold_a_slot(slots: SharedSlots, taken: Event, release: Event) -> None:
    """Another front end: takes a slot, holds it until told, gives it back."""

    async def run() -> None:
        assert await slots.take(5.0)
        taken.set()
        while not release.is_set():
            await asyncio.sleep(0.01)
        slots.give()

    asyncio.run(run())


def controller(slots: SharedSlots, *, max_queued: int, timeout_s: float) -> AdmissionController:
    return AdmissionController(
        slots=slots, max_queued=max_queued, queue_timeout_s=timeout_s, retry_after_s=1, metrics=GatewayMetrics()
    )


@pytest.fixture
def other_process_holds_the_slot() -> tuple[SharedSlots, Event]:
    slots = SharedSlots(1, SPAWN)
    taken, release = SPAWN.Event(), SPAWN.Event()
    process = SPAWN.Process(target=hold_a_slot, args=(slots, taken, release))
    process.start()
    assert taken.wait(30), "the other process never took its slot"
    yield slots, release
    release.set()
    process.join(30)
    assert process.exitcode == 0


def test_a_slot_taken_in_another_process_is_taken_here(other_process_holds_the_slot: tuple[SharedSlots, Event]) -> None:
    slots, _ = other_process_holds_the_slot
    assert slots.counts() == (1, 0)
    with pytest.raises(GatewayError) as refused:
        asyncio.run(controller(slots, max_queued=0, timeout_s=0.2).acquire())
    assert refused.value.status == 429 and "waiting queue is full" in refused.value.message


def test_a_waiter_gets_the_slot_another_process_gives_back(other_process_holds_the_slot: tuple[SharedSlots, Event]) -> None:
    slots, release = other_process_holds_the_slot
    admission = controller(slots, max_queued=1, timeout_s=10.0)

    async def wait_then_release() -> None:
        waiter = asyncio.create_task(admission.acquire())
        await asyncio.sleep(0.2)
        assert not waiter.done() and slots.counts() == (1, 1)  # queued, service-wide
        release.set()
        await asyncio.wait_for(waiter, 10)
        assert slots.counts() == (1, 0) and admission.active == 1
        admission.release()

    asyncio.run(wait_then_release())
    assert slots.counts() == (0, 0)


def test_a_waiter_times_out_with_429(other_process_holds_the_slot: tuple[SharedSlots, Event]) -> None:
    slots, _ = other_process_holds_the_slot
    with pytest.raises(GatewayError) as refused:
        asyncio.run(controller(slots, max_queued=4, timeout_s=0.1).acquire())
    assert "no slot freed within 0.1 s" in refused.value.message
    assert slots.counts() == (1, 0)  # the waiter left the queue
