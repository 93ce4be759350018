"""An engine core that never answers an identity question is dead, not waited on forever (service/engine/vllm_engine.py)."""

from __future__ import annotations

import asyncio

import pytest

from service.engine import vllm_engine
from service.engine.protocol import EngineDeadError


def test_an_answer_that_never_comes_is_an_engine_death(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_engine, "IDENTITY_RPC_TIMEOUT_S", -14.95)  # the round trip then gets 0.05 s
    with pytest.raises(EngineDeadError, match="did not answer"):
        asyncio.run(vllm_engine.answered_in_time(asyncio.sleep(30)))


def test_an_answer_in_time_is_returned() -> None:
    async def answer() -> list[str]:
        await asyncio.sleep(0.01)
        return ["FLASH_ATTN"]

    assert asyncio.run(vllm_engine.answered_in_time(answer())) == ["FLASH_ATTN"]
