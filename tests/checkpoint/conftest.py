"""Fixtures for the tiny-checkpoint tests (self-contained).

* ``tiny_checkpoint``: the built checkpoint folder, from ``ensure_tiny_checkpoint()``
  (cached under ``$MOSS_GATEWAY_CACHE_DIR`` or ``~/.cache/moss-gateway``).
* ``hf_reference``: processor + model loaded the way a user would, through the Auto
  classes with ``trust_remote_code=True``.
* ``vllm_engine``: one synchronous in-process ``vllm.LLM`` for the whole session.

Hugging Face, vLLM and Inductor caches and TMPDIR point into a session temp folder,
and the hub is offline.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

SAMPLE_RATE = 16_000
LONG_SAMPLES = 37 * SAMPLE_RATE  # two 30 s windows


@pytest.fixture(scope="session")
def isolated_env(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("moss-env")
    wanted = {
        "HF_HOME": str(base / "hf"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(base / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(base / "inductor"),
        "TMPDIR": str(base / "tmp"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    for key in ("HF_HOME", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
        Path(wanted[key]).mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    yield base
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def tiny_checkpoint(isolated_env) -> Path:
    from service.checkpoint import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint()


@pytest.fixture(scope="session")
def clip_audio() -> np.ndarray:
    from qualification.clip import FROZEN_CLIP_PATH

    audio, sr = sf.read(str(FROZEN_CLIP_PATH), dtype="float32")
    assert sr == SAMPLE_RATE
    return audio


@pytest.fixture(scope="session")
def noise_audio() -> np.ndarray:
    rng = np.random.default_rng(1234)
    return (0.1 * rng.standard_normal(10 * SAMPLE_RATE)).astype(np.float32)


@pytest.fixture(scope="session")
def long_audio(clip_audio: np.ndarray) -> np.ndarray:
    """37 s: the clip repeated (speech in both 30 s windows) plus a little noise."""
    rng = np.random.default_rng(37)
    reps = np.tile(clip_audio, 4)[:LONG_SAMPLES]
    return (reps + 0.003 * rng.standard_normal(LONG_SAMPLES)).astype(np.float32)


class HFReference:
    def __init__(self, path: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(str(path), trust_remote_code=True)
        self.tokenizer = self.processor.tokenizer
        self.model = AutoModelForCausalLM.from_pretrained(str(path), trust_remote_code=True)
        self.model.eval()

    def inputs(self, audio: np.ndarray, instruction: str | None = None):
        prompt = self.processor.build_prompt(instruction)
        return self.processor(text=prompt, audio=[audio], return_tensors="pt")

    def greedy(self, audio: np.ndarray, max_new_tokens: int, min_new_tokens: int | None = None, **kwargs):
        import torch

        enc = self.inputs(audio)
        with torch.no_grad():
            out = self.model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=min_new_tokens,
                **kwargs,
            )
        return enc, out


@pytest.fixture(scope="session")
def hf_reference(tiny_checkpoint: Path) -> HFReference:
    return HFReference(tiny_checkpoint)


@pytest.fixture(scope="session")
def vllm_engine(tiny_checkpoint: Path, isolated_env):
    pytest.importorskip("vllm")
    from vllm import LLM

    llm = LLM(
        model=str(tiny_checkpoint),
        trust_remote_code=True,
        dtype="float32",
        max_model_len=4096,
        limit_mm_per_prompt={"audio": {"count": 1, "length": LONG_SAMPLES}},
        kv_cache_memory_bytes=64 * 1024 * 1024,
        enforce_eager=True,
        seed=0,
    )
    yield llm
    del llm
    gc.collect()
    try:
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
    except Exception:  # best effort: later engines in the same process start clean
        pass
