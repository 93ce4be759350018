"""The cached reference run: sealed like the records, keyed by every file hash of the identity."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qualification import runner
from qualification.records import RecordStore
from qualification.runner import Clip, reference_cache_key, reference_identity, run_reference_subprocess
from service.identity import checkpoint_identity
from service.settings import QualificationSettings

CLIP = Clip(samples=np.zeros(16000, np.float32), sha256_file="f" * 64, sha256_samples="s" * 64, duration_s=1.0, name="c.wav")
FILES = {
    "config.json": '{"architectures": ["X"]}',
    "generation_config.json": '{"eos_token_id": 5}',
    "tokenizer.json": '{"model": {"vocab": {"a": 0}}}',
    "tokenizer_config.json": "{}",
    "processor_config.json": '{"audio_merge_size": 4}',
    "preprocessor_config.json": '{"feature_size": 80}',
    "model.safetensors": "weights",
    "modeling_x.py": "# remote code",
}


def checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in FILES.items():
        (folder / name).write_text(text)
    return folder


def key_for(model_dir: Path, engine_dir: Path | None = None) -> str:
    engine_dir = engine_dir or model_dir
    backend = {"checkpoint": checkpoint_identity(engine_dir, revision=None), "runtime": {"torch": {"version": "t"}}}
    identity = reference_identity(
        model_dir=model_dir, backend_identity=backend, engine_model_dir=engine_dir, settings=QualificationSettings()
    )
    return reference_cache_key(identity=identity, clip=CLIP, instruction="i", max_new_tokens=8)


@pytest.mark.parametrize(
    "name", ["tokenizer.json", "generation_config.json", "processor_config.json", "preprocessor_config.json",
             "model.safetensors", "modeling_x.py", "config.json"],
)
def test_changing_any_checkpoint_file_changes_the_key(tmp_path: Path, name: str) -> None:
    model = checkpoint(tmp_path / "m")
    before = key_for(model)
    (model / name).write_text(FILES[name].replace("}", ', "x": 1}') if name.endswith(".json") else FILES[name] + "!")
    assert key_for(model) != before


def test_a_separate_reference_checkpoint_is_keyed_by_its_own_files(tmp_path: Path) -> None:
    engine = checkpoint(tmp_path / "engine")
    reference = checkpoint(tmp_path / "reference")
    before = key_for(reference, engine)
    (reference / "tokenizer.json").write_text('{"model": {"vocab": {"b": 0}}}')
    assert key_for(reference, engine) != before
    assert key_for(engine) == key_for(engine)  # stable while nothing changes


def test_the_identity_reuses_the_backend_identitys_hashes(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "m")
    marker = {"weights": {"model.safetensors": "from-the-backend-identity"}}
    identity = reference_identity(
        model_dir=model, backend_identity={"checkpoint": marker}, engine_model_dir=model,
        settings=QualificationSettings(),
    )
    assert identity["checkpoint"] is marker


class ReferenceChild:
    """Stands in for the Transformers child process; counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    async def __call__(self, **_: Any) -> dict[str, Any]:
        self.runs += 1
        return {"token_ids": [1, 2, 3], "stop": "eos", "prompt_ids": [9], "top2": []}


async def cached_run(store: RecordStore, child: ReferenceChild, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr(runner, "_reference_child", child)
    return await run_reference_subprocess(
        model_dir=Path("unused"), clip=CLIP, instruction="i", settings=QualificationSettings(), store=store,
        identity={"checkpoint": {"weights": {"m": "h"}}}, progress=lambda _: None,
    )


async def test_a_sealed_cache_entry_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, child = RecordStore(tmp_path), ReferenceChild()
    first = await cached_run(store, child, monkeypatch)
    second = await cached_run(store, child, monkeypatch)
    assert (first["cached"], second["cached"], child.runs) == (False, True, 1)
    assert second["token_ids"] == [1, 2, 3]


async def test_a_tampered_cache_entry_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, child = RecordStore(tmp_path), ReferenceChild()
    await cached_run(store, child, monkeypatch)
    (entry,) = (tmp_path / "reference-cache").glob("*.json")
    document = json.loads(entry.read_text())
    document["token_ids"] = [7, 7, 7]  # what an engine that writes 7s would need to pass
    entry.write_text(json.dumps(document))
    result = await cached_run(store, child, monkeypatch)
    assert (result["cached"], result["token_ids"], child.runs) == (False, [1, 2, 3], 2)
    assert store.verify(json.loads(entry.read_text())) is not None  # rewritten, sealed


async def test_an_unsealed_or_foreign_cache_entry_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, child = RecordStore(tmp_path / "mine"), ReferenceChild()
    await cached_run(store, child, monkeypatch)
    (entry,) = (tmp_path / "mine" / "reference-cache").glob("*.json")
    body = store.verify(json.loads(entry.read_text()))
    assert body is not None
    entry.write_text(json.dumps({**body, "token_ids": [7]}))  # the old cache format: no seal at all
    assert (await cached_run(store, child, monkeypatch))["token_ids"] == [1, 2, 3]
    foreign = RecordStore(tmp_path / "other")
    entry.write_text(json.dumps(foreign.sealed({**body, "token_ids": [7]})))  # sealed with another key
    assert (await cached_run(store, child, monkeypatch))["token_ids"] == [1, 2, 3]
    assert child.runs == 3
