"""The project's tiny MOSS-Transcribe-Diarize checkpoint (real architecture, tiny sizes).

``ensure_tiny_checkpoint()`` builds it once (about 6-10 s on 2 idle CPU cores) into a cache
folder keyed by a content hash and returns the folder, which loads with

* ``AutoProcessor.from_pretrained(path, trust_remote_code=True)``
* ``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)``
  (``AutoModel`` gives the body without the LM head)
* ``vllm.LLM(model=str(path), trust_remote_code=True, dtype="float32", ...)`` through
  vLLM's native ``MossTranscribeDiarizeForConditionalGeneration``.

Greedy decoding of the frozen qualification clip (``qualification.clip``) with the
default instruction writes exactly ``FROZEN_CLIP_TRANSCRIPT`` then ``<|im_end|>``;
10 s of silence gives ``<|im_end|>`` at once. It was also taught the three inputs of the
tail recovery test (``build.training_examples``): the clip followed by silence and the clip
followed by the tail clip both give the clip's transcript, and the recovery pass over the
second of them, from its frozen cut, gives the tail clip's segments.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from qualification.clip import FROZEN_CLIP_PATH, FROZEN_CLIP_TRANSCRIPT, TAIL_CLIP_PATH, TAIL_CLIP_TRANSCRIPT
from service.checkpoint.build import build_checkpoint, recovery_cut_s

__all__ = [
    "TINY_CHECKPOINT_NAME",
    "CACHE_DIR_ENV",
    "checkpoint_key",
    "default_cache_dir",
    "ensure_tiny_checkpoint",
]

TINY_CHECKPOINT_NAME = "moss-transcribe-diarize-tiny"
CACHE_DIR_ENV = "MOSS_GATEWAY_CACHE_DIR"
_COMPLETE_MARKER = ".complete"

_PKG_DIR = Path(__file__).resolve().parent
_SOURCE_FILES = (
    "build.py",
    "tokenizer.py",
    "remote_code/configuration_moss_transcribe_diarize.py",
    "remote_code/modeling_moss_transcribe_diarize.py",
    "remote_code/processing_moss_transcribe_diarize.py",
)
_VERSIONED_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors")


def default_cache_dir() -> Path:
    """``$MOSS_GATEWAY_CACHE_DIR`` or ``~/.cache/moss-gateway``."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "moss-gateway"


def _cpu_model() -> str:
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{platform.machine()}:{line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"{platform.machine()}:{platform.processor()}"


def checkpoint_key() -> str:
    """Content hash of everything the build depends on: the builder's sources, the
    frozen and tail clips' bytes and transcripts, the recovery cut it teaches, the sizes
    (inside build.py), the library versions and the CPU model (so a cache copied between
    CPU types is not reused)."""
    h = hashlib.sha256()
    for rel in _SOURCE_FILES:
        h.update(rel.encode())
        h.update(b"\0")
        h.update((_PKG_DIR / rel).read_bytes())
        h.update(b"\0")
    h.update(Path(FROZEN_CLIP_PATH).read_bytes())
    h.update(FROZEN_CLIP_TRANSCRIPT.encode())
    h.update(Path(TAIL_CLIP_PATH).read_bytes())
    h.update(TAIL_CLIP_TRANSCRIPT.encode())
    h.update(f"recovery_cut_s={recovery_cut_s()}\0".encode())  # follows a settings default, not a source here
    h.update(f"cpu={_cpu_model()}\0".encode())  # float rounding may differ between CPU types
    for pkg in _VERSIONED_PACKAGES:
        try:
            version = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            version = "absent"
        h.update(f"{pkg}={version}\0".encode())
    return h.hexdigest()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: rely on the atomic rename alone
        yield
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_tiny_checkpoint(cache_dir: Path | None = None) -> Path:
    """Return the folder of the tiny checkpoint, building it first if needed.

    The folder is ``<cache_dir>/moss-transcribe-diarize-tiny-<key16>``.  It is built in a
    temporary sibling folder and renamed into place, so a folder with that name is
    always complete; concurrent callers (threads or processes) serialise on a lock file
    and a loser of the rename race simply uses the winner's folder.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    key = checkpoint_key()
    final = root / f"{TINY_CHECKPOINT_NAME}-{key[:16]}"
    if (final / _COMPLETE_MARKER).is_file():
        return final

    with _file_lock(root / f".{TINY_CHECKPOINT_NAME}-{key[:16]}.lock"):
        if (final / _COMPLETE_MARKER).is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{TINY_CHECKPOINT_NAME}-build-", dir=root))
        try:
            report = build_checkpoint(tmp / "ckpt")
            (tmp / "ckpt" / _COMPLETE_MARKER).write_text(json.dumps({"key": key, **report}, indent=2) + "\n")
            if final.exists() and not (final / _COMPLETE_MARKER).is_file():
                shutil.rmtree(final, ignore_errors=True)  # a stale, incomplete folder
            try:
                os.rename(tmp / "ckpt", final)
            except OSError:
                if not (final / _COMPLETE_MARKER).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
