"""An engine core that never answers an identity question is dead, not waited on forever (service/engine/vllm_engine.py)."""

from __future__ import annotations

import asyncio

import pytest

from service.engine import vllm_engine
from service.engine.protocol import EngineDeadError


def test_an_answer_that_never_comes_is_an_engine_death(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_engine, "IDENTITY_RPC_TIMEOUT_S", 0.05)
    asked: list[int] = []

    def ask() -> object:
        asked.append(1)
        return asyncio.sleep(30)

    with pytest.raises(EngineDeadError, match="did not answer"):
        asyncio.run(vllm_engine.answered_in_time(ask))
    assert len(asked) == vllm_engine.IDENTITY_RPC_ATTEMPTS  # asked again before giving up


def test_a_question_lost_once_is_answered_when_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_engine, "IDENTITY_RPC_TIMEOUT_S", 0.05)
    asked: list[int] = []

    async def answer() -> list[str]:
        asked.append(1)
        await asyncio.sleep(30 if len(asked) == 1 else 0.001)  # the first request is lost
        return ["FLASH_ATTN"]

    assert asyncio.run(vllm_engine.answered_in_time(answer)) == ["FLASH_ATTN"] and len(asked) == 2
