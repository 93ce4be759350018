"""Data parallelism on the fake engine: per-rank qualification, chunks spread over the ranks, identity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_engine import EOS, FakeEngine
from helpers import AppFactory
from test_api_chunked import LONGFORM, SERVER_VAD, speech_with_pauses, transcribe

from qualification import runner
from qualification.clip import FROZEN_CLIP_PATH
from qualification.records import RecordStore, fingerprint_of, ranks_not_passing
from service.engine.protocol import GenerationRequest
from service.identity import rank_identity
from service.settings import QualificationSettings
from service.transcription.tracks import chunk_rank

SCRIPT = "[0.50][S01]Hello.[1.00]"


def engine_for(bad_rank: int = -1, size: int = 2) -> FakeEngine:
    """A fake engine whose `bad_rank` writes something else than the reference."""

    def script(request: GenerationRequest) -> str:
        return "[0.50][S01]Other.[1.00]" if request.data_parallel_rank == bad_rank else SCRIPT

    return FakeEngine(script, data_parallel_size=size)


def identity_of(engine: FakeEngine) -> dict[str, Any]:
    return {"runtime": {"accelerator": {"kind": "cpu"}}, "engine": {"data_parallel_size": engine.data_parallel_size}}


async def qualify_fake(engine: FakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    reference = {
        "token_ids": [ord(c) for c in SCRIPT] + [EOS], "stop": "eos", "prompt_ids": None, "top2": [], "text": SCRIPT,
        "identity": {}, "generation_config": {}, "timings": {}, "memory": {},
    }

    async def no_reference(**_: Any) -> dict[str, Any]:
        return reference

    async def no_scoring(**_: Any) -> dict[Any, Any]:
        return {}

    monkeypatch.setattr(runner, "run_reference_subprocess", no_reference)
    monkeypatch.setattr(runner, "score_candidates", no_scoring)
    return await runner.qualify(
        engine=engine, identity=identity_of(engine), fingerprint=fingerprint_of(identity_of(engine)),
        model_dir=tmp_path, state_dir=tmp_path, settings=QualificationSettings(batch_size=3, max_new_tokens=64),
        clip_path=FROZEN_CLIP_PATH,
    )


async def test_every_rank_runs_both_checks_pinned_to_it_and_all_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = engine_for()
    record = await qualify_fake(engine, tmp_path, monkeypatch)
    pins = [r.data_parallel_rank for r in engine.requests]
    assert pins == [0] * 4 + [1] * 4  # per rank: the clip alone, then the clip among 3 (batch_size)
    assert [rank["rank"] for rank in record["ranks"]] == [0, 1]
    assert record["ranks"][1]["devices"] == [{"kind": "fake", "index": 1}]
    assert all(rank["verdict"]["passed"] and rank["verdict"]["batched_passed"] for rank in record["ranks"])
    assert record["verdict"]["passed"] and record["verdict"]["batched_passed"]
    found, _ = RecordStore(tmp_path / "qualification").passing_for(record["fingerprint"], policy="explainable")
    assert found is not None
    # A record whose rank results were dropped does not count for a two-rank engine.
    assert ranks_not_passing({**record, "ranks": record["ranks"][:1]}) == [1]


async def test_one_failing_rank_fails_the_whole_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = await qualify_fake(engine_for(bad_rank=1), tmp_path, monkeypatch)
    assert [rank["verdict"]["passed"] for rank in record["ranks"]] == [True, False]
    assert record["verdict"]["passed"] is False and record["verdict"]["batched_passed"] is False
    found, notes = RecordStore(tmp_path / "qualification").passing_for(record["fingerprint"], policy="explainable")
    assert found is None and notes


async def test_without_data_parallelism_the_record_keeps_its_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = engine_for(size=1)
    record = await qualify_fake(engine, tmp_path, monkeypatch)
    assert "ranks" not in record
    assert {r.data_parallel_rank for r in engine.requests} == {None}  # vLLM chooses; nothing pinned
    assert record["verdict"]["passed"]


def test_chunks_go_round_robin_over_the_ranks() -> None:
    assert [chunk_rank(i, 2) for i in range(5)] == [0, 1, 0, 1, 0]
    assert [chunk_rank(i, 3) for i in range(4)] == [0, 1, 2, 0]
    assert chunk_rank(7, 1) is None


def test_a_chunked_program_spreads_its_chunks_over_every_rank(fake_client: AppFactory) -> None:
    client, engine = fake_client(FakeEngine(data_parallel_size=2), longform=LONGFORM)
    response = transcribe(client, speech_with_pauses(), chunking_strategy=SERVER_VAD)
    assert response.status_code == 200, response.text
    assert sorted((r.request_id[-3:], r.data_parallel_rank) for r in engine.requests) == [
        ("-c0", 0), ("-c1", 1), ("-c2", 0),
    ]
    response = transcribe(client, speech_with_pauses(10.0))  # one native pass: vLLM balances it
    assert engine.requests[-1].data_parallel_rank is None


def test_the_identity_keeps_the_device_model_and_drops_the_gpus_serial() -> None:
    ranks = [{"rank": 0, "devices": [{"kind": "cuda", "index": 0, "name": "H200", "uuid": "GPU-1", "pci_bus_id": "0"}]}]
    assert rank_identity(ranks) == [{"rank": 0, "devices": [{"kind": "cuda", "index": 0, "name": "H200"}]}]
