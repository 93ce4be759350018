"""What the benchmark runs: clip lengths, concurrency, forced output lengths, audio.

Output lengths are forced with ``ignore_eos`` at the density measured on a dense
two-person podcast, 12.75 output tokens per audio second (12 s -> 153,
600 s -> 7,650), except where the issue fixes a number: the 2861.5 s program
generates 36,492 tokens (its measured full transcript), and the 300 s case that
is compared with the Transformers reference keeps the 1,000 tokens measured on
the bench host before (``shared/facts/bench-host.md``).

Every request gets its own audio (seeded noise), so neither vLLM's multimodal
processor cache nor its prefix cache can turn a repeated clip into a cache hit.
"""

from __future__ import annotations

import io
import wave
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_RATE = 16_000
OUTPUT_TOKENS_PER_AUDIO_SECOND = 12.75
PROGRAM_DURATION_S = 2861.5
PROGRAM_OUTPUT_TOKENS = 36_492
#: Noise level of the synthetic audio (its content does not change the speed of a forced-length run).
NOISE_RMS = 0.05


def density_tokens(duration_s: float) -> int:
    return int(round(duration_s * OUTPUT_TOKENS_PER_AUDIO_SECOND))


@dataclass(frozen=True)
class Cell:
    """One measured configuration: every request the same shape, `concurrency` closed-loop workers."""

    name: str
    workload: str
    duration_s: float
    concurrency: int
    requests_per_worker: int
    output_tokens: int
    paths: tuple[str, ...] = ("direct", "gateway")
    #: gateway requests as server-sent events (client-side time to first token)
    stream: bool = False
    #: a short run of this shape before the measured ones (kernels, graphs, allocator)
    warmup_tokens: int = 16

    @property
    def num_requests(self) -> int:
        return self.concurrency * self.requests_per_worker

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["num_requests"] = self.num_requests
        return data


def _short() -> list[Cell]:
    n = density_tokens(12.0)
    return [
        Cell("short-12s-c1", "short", 12.0, 1, 20, n, paths=("direct", "gateway", "raw"), warmup_tokens=n),
        Cell("short-12s-c4", "short", 12.0, 4, 5, n, warmup_tokens=n),
        Cell("short-12s-c16", "short", 12.0, 16, 4, n, warmup_tokens=n),
        Cell("short-12s-c64", "short", 12.0, 64, 3, n, warmup_tokens=n),
        Cell("short-12s-c1-stream", "short", 12.0, 1, 10, n, paths=("gateway",), stream=True, warmup_tokens=n),
    ]


def _long() -> list[Cell]:
    n = density_tokens(600.0)
    return [
        Cell("long-300s-c1-1000out", "long", 300.0, 1, 2, 1000),
        Cell("long-300s-c1-1000out-stream", "long", 300.0, 1, 1, 1000, paths=("gateway",), stream=True),
        Cell("long-600s-c1", "long", 600.0, 1, 1, n),
        Cell("long-600s-c8", "long", 600.0, 8, 1, n),
    ]


def _program() -> list[Cell]:
    return [Cell("program-2861.5s-c1", "program", PROGRAM_DURATION_S, 1, 1, PROGRAM_OUTPUT_TOKENS)]


def _reference() -> list[Cell]:
    """The Transformers reference (no vLLM): the 12 s and 300 s cases, one stream."""
    return [
        Cell("reference-12s-c1", "reference", 12.0, 1, 2, density_tokens(12.0), paths=("transformers",)),
        Cell("reference-300s-c1-1000out", "reference", 300.0, 1, 1, 1000, paths=("transformers",)),
    ]


WORKLOADS = {"short": _short, "long": _long, "program": _program, "reference": _reference}
ENGINE_WORKLOADS = ("short", "long", "program")


def cells_for(workloads: list[str], *, smoke: bool = False) -> list[Cell]:
    cells: list[Cell] = []
    for name in workloads:
        if name not in WORKLOADS:
            raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
        cells.extend(WORKLOADS[name]())
    return [smoke_cell(c) for c in cells] if smoke else cells


def smoke_cell(cell: Cell) -> Cell:
    """A CPU-sized version of a cell (tiny checkpoint): same structure, little work."""
    duration = {"short": 12.0, "long": 40.0, "program": 70.0, "reference": 12.0}[cell.workload]
    if cell.workload == "long" and cell.duration_s < 400:
        duration = 31.0
    return replace(
        cell,
        duration_s=duration,
        concurrency=min(cell.concurrency, 4),
        requests_per_worker=min(cell.requests_per_worker, 3),
        output_tokens=min(cell.output_tokens, 12),
        warmup_tokens=4,
    )


# -- audio --------------------------------------------------------------------
def num_samples(duration_s: float) -> int:
    return int(round(duration_s * SAMPLE_RATE))


def noise_pcm16(duration_s: float, seed: int) -> np.ndarray:
    """Seeded Gaussian noise as 16-bit PCM (what the WAV carries)."""
    rng = np.random.default_rng(seed)
    samples = rng.standard_normal(num_samples(duration_s), dtype=np.float32) * NOISE_RMS
    return np.clip(np.round(samples * 32767.0), -32768, 32767).astype(np.int16)


def pcm16_to_float(pcm: np.ndarray) -> np.ndarray:
    """What a WAV decoder (libsndfile) gives for PCM-16: int / 32768 as float32."""
    return (pcm.astype(np.float32) / 32768.0).astype(np.float32)


def wav_bytes(pcm: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(pcm.astype("<i2").tobytes())
    return buffer.getvalue()


def write_wav(path: Path, pcm: np.ndarray) -> Path:
    path.write_bytes(wav_bytes(pcm))
    return path


def read_wav_float(path: Path) -> np.ndarray:
    """A WAV written by `write_wav` back as float32 samples (what `direct` gets from `pcm16_to_float`)."""
    with wave.open(str(path), "rb") as handle:
        if handle.getsampwidth() != 2 or handle.getnchannels() != 1:
            raise ValueError(f"{path}: expected 16-bit mono PCM")
        pcm = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")
    return pcm16_to_float(pcm)


def audio_tokens(duration_s: float) -> int:
    """Audio embedding tokens (per 30 s window of n samples: (n - 1) // 1280 + 1)."""
    total, n = 0, num_samples(duration_s)
    for start in range(0, n, 480_000):
        total += (min(480_000, n - start) - 1) // 1280 + 1
    return total


def describe_cell(cell: Cell) -> str:
    return (
        f"{cell.name}: {cell.num_requests} x {cell.duration_s:g} s at concurrency {cell.concurrency}, "
        f"{cell.output_tokens} output tokens each ({', '.join(cell.paths)})"
    )


__all__ = [
    "Cell",
    "ENGINE_WORKLOADS",
    "OUTPUT_TOKENS_PER_AUDIO_SECOND",
    "PROGRAM_DURATION_S",
    "PROTOCOL_CELL_NAMES",
    "PROGRAM_OUTPUT_TOKENS",
    "WORKLOADS",
    "audio_tokens",
    "cells_for",
    "density_tokens",
    "describe_cell",
    "noise_pcm16",
    "pcm16_to_float",
    "protocol_cells",
    "wav_bytes",
    "write_wav",
]


# -- the interleaved protocol (issue 13) ------------------------------------
#: The protocol's cells, in their default order: the two concurrency cells the goal is about
#: first, then one stream (own time per request), then 600 s x 8.
PROTOCOL_CELL_NAMES = ("short-12s-c16", "short-12s-c64", "short-12s-c1", "long-600s-c8")


def protocol_cells(names: list[str] | tuple[str, ...], *, paths: tuple[str, ...], smoke: bool = False) -> list[Cell]:
    """The named protocol cells (in the given order), each measuring `paths` in every repetition."""
    short, long = density_tokens(12.0), density_tokens(600.0)
    every = {
        "short-12s-c16": Cell("short-12s-c16", "short", 12.0, 16, 4, short, paths=paths, warmup_tokens=short),
        "short-12s-c64": Cell("short-12s-c64", "short", 12.0, 64, 3, short, paths=paths, warmup_tokens=short),
        # 30 sequential requests a block: with 10, one path's own blocks differed by up to 25 % between
        # repetitions on the H200 (docs/benchmarks.md, "Same engine"), too coarse for a 3 % own-time goal
        "short-12s-c1": Cell("short-12s-c1", "short", 12.0, 1, 30, short, paths=paths, warmup_tokens=short),
        "long-600s-c8": Cell("long-600s-c8", "long", 600.0, 8, 1, long, paths=paths),
    }
    unknown = [n for n in names if n not in every]
    if unknown:
        raise ValueError(f"unknown protocol cell(s) {', '.join(unknown)}; choose from {', '.join(every)}")
    cells = [every[n] for n in names]
    return [smoke_cell(c) for c in cells] if smoke else cells
