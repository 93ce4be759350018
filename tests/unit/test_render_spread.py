"""tools/render_spread.py: the gateway's render call on vLLM's real renderer, several chunks at once."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from transformers import AutoProcessor

from service.checkpoint import ensure_tiny_checkpoint
from service.prompt import DEFAULT_INSTRUCTION, PromptBuilder

pytest.importorskip("vllm")

TOOL = Path(__file__).resolve().parents[2] / "tools" / "render_spread.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_spread", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["render_spread"] = module
    spec.loader.exec_module(module)
    return module


def test_every_chunk_is_rendered_with_its_audio_span() -> None:
    tool = _tool()
    checkpoint = ensure_tiny_checkpoint()
    renderer, model_config = tool.build_renderer(checkpoint, workers=2)
    assert model_config.renderer_num_workers == 2
    tokenizer = AutoProcessor.from_pretrained(str(checkpoint), trust_remote_code=True).tokenizer
    ids = PromptBuilder(tokenizer).prompt_ids(DEFAULT_INSTRUCTION)
    prompt = {"prompt_token_ids": ids, "multi_modal_data": {"audio": (np.zeros(5 * 16_000, np.float32), 16_000)}}
    rendered = asyncio.run(tool.render_prompt(renderer, model_config, prompt))
    assert len(rendered["prompt_token_ids"]) > len(ids)  # the one placeholder became the audio span
    offsets, wall = asyncio.run(tool.ready_offsets(renderer, model_config, [prompt] * 3))
    assert len(offsets) == 3 and offsets == sorted(offsets) and 0 < offsets[-1] <= wall
