"""The engine choices of EngineSettings reach vLLM's engine arguments (and only when set)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.settings import EngineSettings

pytest.importorskip("vllm")


def _args(tmp_path: Path, **fields: Any) -> Any:
    from service.engine.vllm_engine import VllmTranscriptionEngine

    engine = VllmTranscriptionEngine(
        EngineSettings(**fields), model_dir=tmp_path, max_num_batched_tokens=4096, max_audio_samples=16_000,
        shutdown_timeout_s=5.0,
    )
    return engine.engine_args()


def _get(config: Any, key: str) -> Any:
    return config[key] if isinstance(config, dict) else getattr(config, key)


def test_engine_choices_reach_vllm(tmp_path: Path) -> None:
    args = _args(
        tmp_path,
        attention_backend="TRITON_ATTN",
        kv_cache_dtype="fp8",
        async_scheduling=False,
        cudagraph_mode="FULL_DECODE_ONLY",
        cudagraph_capture_sizes=[8, 1, 2, 2],
        flash_attn_max_num_splits=128,
        renderer_num_workers=7,
        distributed_executor_backend="uni",
    )
    assert args.renderer_num_workers == 7
    assert args.distributed_executor_backend == "uni"
    # vLLM 0.26 refuses several renderer workers while its processor cache is on (regression: the H200 start failed).
    assert args.mm_processor_cache_gb == 0
    assert args.async_scheduling is False
    assert args.kv_cache_dtype == "fp8"
    assert args.cudagraph_capture_sizes == [1, 2, 8]
    assert str(_get(args.compilation_config, "cudagraph_mode")).endswith("FULL_DECODE_ONLY")
    assert _get(args.attention_config, "flash_attn_max_num_splits_for_cuda_graph") == 128
    assert "TRITON_ATTN" in str(args.attention_backend)


def test_unset_choices_leave_vllm_defaults(tmp_path: Path) -> None:
    from vllm import AsyncEngineArgs

    defaults = AsyncEngineArgs(model=str(tmp_path))
    args = _args(tmp_path)
    assert args.async_scheduling == defaults.async_scheduling
    assert args.distributed_executor_backend == defaults.distributed_executor_backend
    assert args.cudagraph_capture_sizes == defaults.cudagraph_capture_sizes
    assert _get(args.compilation_config, "cudagraph_mode") == _get(defaults.compilation_config, "cudagraph_mode")
    assert _get(args.attention_config, "flash_attn_max_num_splits_for_cuda_graph") == _get(
        defaults.attention_config, "flash_attn_max_num_splits_for_cuda_graph"
    )


def test_bad_choices_are_refused_by_the_settings() -> None:
    with pytest.raises(ValueError):
        EngineSettings(cudagraph_mode="SOMETIMES")
    with pytest.raises(ValueError):
        EngineSettings(flash_attn_max_num_splits=0)
    with pytest.raises(ValueError):
        EngineSettings(renderer_num_workers=0)
    with pytest.raises(ValueError):
        EngineSettings(distributed_executor_backend="ray")  # one host; vLLM's Ray path is not part of this product
