"""``python -m bench.dp``: data parallelism through the gateway (issue 17), dp=1 against dp=2.

    python -m bench.dp run --model DIR --out dp.json [--repeats 3] [--program-dp 2,1] [engine options]
    python -m bench.dp report dp.json [--plot docs/dp.png]
    python -m bench.dp chunks gateway-dp2.log[.xz] ...   # the chunked program's per-chunk timings
    python -m bench.dp serve            # one gateway, settings from MOSS_GATEWAY_* (spawned by `run`)

What runs: two gateways (`moss-gateway serve`'s app, each its own process with its
own engine and state directory), **both up for the whole run**: dp=1 on GPU 0 and
dp=2 on GPUs 0 and 1. They share GPU 0, so each engine gets an explicit KV cache
(`--kv-cache-memory-bytes`) and a memory fraction that lets both fit side by side
(`--gpu-memory-utilization`, 0.40 each by default; see bench/device/dp.sh). Running
them side by side, not one after the other, is what lets one run interleave the
repeats (the spread between hosts and runs is up to 25 %, bench-host.md): only one
block runs at a time, so neither engine computes while the other is measured.

Blocks, interleaved: in repetition r, the (cell, dp) blocks run in an order rotated
by r (`schedule`). Cells: ``short-12s-c128`` (128 concurrent streams of 12 s noise
clips, 153 tokens forced with ignore_eos, the throughput protocol's shape), on both;
``short-12s-c256`` on dp=2 (every GPU at dp=1's 128-stream load); ``short-12s-c64``
on dp=1 (each rank's load in dp=2 at 128: dp=2 at 128 over it is data parallelism's
own scaling, dp=1 at 128 over it one GPU's gain from the batch); and
``program-chunked`` (the 2861.5 s program through the chunked track, ignore_eos,
the program's 36,492 tokens split evenly over the chunks). The dp=2 gateway gets
``--api-processes-per-rank`` front ends per rank, as `vllm serve` scales its API servers.
Each block is one row: cell, path (always ``gateway``), repeat, wall_s, requests, dp,
and the tokens the gateway reports it generated (``X-Moss-Generated-Tokens``) against
the tokens forced, so a program block that did not decode the program's whole
36,492 tokens can never pass for one (a run of 2026-11-30 did: the bench planned the
chunks with other settings than the gateway's and asked for 5 x 1,014 tokens).
The load runs from ``--client-processes`` client processes (bench.client's shards)
with ``--requests-per-worker`` requests back to back per stream, and every block
samples each rank's running and waiting requests from the gateway's /metrics
(``vllm:num_requests_running{engine=...}``), to tell a starved rank from a full one,
and counts the CPU of every process of the gateway's group by role (front ends,
engine cores, workers), to tell a busy front end from a busy engine.
The summary gives per cell and dp the median wall time and throughput, and per
repetition the dp=2 / dp=1 throughput ratio of the short cell (target >= 1.9) and
the program's wall time on dp=2 (target <= 8 s).

Variants: ``--short-dp`` and ``--program-dp`` take gateway labels (`Gateway`): ``1`` and ``2`` are the
shipped configuration, and e.g. ``1-mp`` (dp=1 with the multiprocess executor) or ``2-api8`` (8 front ends
a rank) adds a gateway that differs in that one setting, measured in the same repetitions and reported
against the plain gateway of its dp. With ``--gpus 1`` a one-GPU host compares dp=1 variants.

The gateways open only on a passing qualification unless ``--allow-unqualified`` is
given (the default of the device script, random weights): then the `serve` process
opens its gate as ``bench-unqualified`` and every answer says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import lzma
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

import httpx
import psutil

from bench.gateway_mp import every_frontend_ready
from bench.protocol import rotation
from bench.workloads import PROGRAM_DURATION_S, PROGRAM_OUTPUT_TOKENS, noise_pcm16, write_wav

logger = logging.getLogger("bench.dp")

SHORT_CELL = "short-12s-c128"
#: dp=2 at twice the streams: each rank then decodes the batch dp=1's one GPU decodes at 128 streams.
SCALED_CELL = "short-12s-c256"
#: dp=1 at half the streams: the load each rank of dp=2 gets at 128, so dp=2 at 128 over this is data
#: parallelism's own scaling (ideal 2.0), and dp=1 at 128 over this is what one GPU gains from the batch.
HALF_CELL = "short-12s-c64"
PROGRAM_CELL = "program-chunked"
SHORT_AUDIO_S, SHORT_STREAMS, SHORT_TOKENS = 12.0, 128, 153
SCALED_STREAMS, HALF_STREAMS = 256, 64
STREAMS = {SHORT_CELL: SHORT_STREAMS, SCALED_CELL: SCALED_STREAMS, HALF_CELL: HALF_STREAMS}
TARGET_RATIO, TARGET_PROGRAM_S = 1.9, 8.0
UNQUALIFIED_ID = "bench-unqualified"
#: Thread-count variables the gateways inherit (torch sizes its CPU thread pool from OMP_NUM_THREADS in every
#: process that runs a model: with engine.distributed_executor_backend=uni that is each engine core).
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: The revision label of service.identity.gateway_revision (the device's copy of the tree may carry a stale .git).
REVISION_ENV = "MOSS_GATEWAY_GIT_REVISION"
REPO_ROOT = Path(__file__).resolve().parent.parent


# -- the logic (unit-tested on CPU) ---------------------------------------------------------------


@dataclass(frozen=True)
class Gateway:
    """One gateway of a run, named by its label: its dp, then variant tags, e.g. ``1``, ``2``, ``1-mp``, ``2-uni-api8``.

    ``1`` and ``2`` are the shipped configuration (every variant setting unset); a tag changes one setting
    against it: ``mp``/``uni`` the executor (engine.distributed_executor_backend), ``fe<N>`` the front ends'
    torch threads (server.frontend_torch_threads), ``api<N>`` the front ends per rank. A variant's blocks
    are compared with the plain gateway of the same dp in the same repetition (`variant_ratios`).
    """

    label: str
    dp: int
    executor: str | None = None
    frontend_torch_threads: int | None = None
    api_processes_per_rank: int | None = None

    @property
    def base(self) -> str:
        """The label of the shipped configuration this one is compared with."""
        return str(self.dp)


def gateway(label: str) -> Gateway:
    """Parse a gateway label (`Gateway`); an unknown tag is an error, not a silent default."""
    dp_text, *tags = label.split("-")
    fields: dict[str, Any] = {}
    for tag in tags:
        if tag in ("mp", "uni"):
            fields["executor"] = tag
        elif match := re.fullmatch(r"fe(\d+)", tag):
            fields["frontend_torch_threads"] = int(match[1])
        elif match := re.fullmatch(r"api(\d+)", tag):
            fields["api_processes_per_rank"] = int(match[1])
        else:
            raise ValueError(f"unknown variant tag {tag!r} in gateway label {label!r}")
    return Gateway(label=label, dp=int(dp_text), **fields)


def blocks(
    *, short: Sequence[str] = ("1", "2"), program: Sequence[str] = ("2", "1"), scaled: bool = True, half: bool = True
) -> list[str]:
    """Every (cell, gateway) block of one repetition, as `cell@label` names.

    The short cell on every gateway of `short`; the scaled cell on those with dp=2, the half cell on those
    with dp=1; the program on every gateway of `program`.
    """
    gateways = [gateway(label) for label in short]
    return (
        [f"{SHORT_CELL}@{g.label}" for g in gateways]
        + ([f"{HALF_CELL}@{g.label}" for g in gateways if g.dp == 1] if half else [])
        + ([f"{SCALED_CELL}@{g.label}" for g in gateways if g.dp == 2] if scaled else [])
        + [f"{PROGRAM_CELL}@{label}" for label in program]
    )


def schedule(names: Sequence[str], repeats: int) -> list[tuple[int, str, str]]:
    """(repeat, cell, gateway label) in run order: every block in every repetition, the order rotated by one per repetition."""
    out = []
    for repeat in range(repeats):
        for name in rotation(list(names), repeat):
            cell, label = name.rsplit("@", 1)
            out.append((repeat, cell, label))
    return out


def label_of(row: dict[str, Any]) -> str:
    """A row's gateway label (rows from before labels name only their dp)."""
    return str(row.get("gateway", row["dp"]))


def dp_row(
    *, cell: str, repeat: int, wall_s: float, requests: int, dp: int, ok: int, audio_s: float,
    generated_tokens: int | None = None, forced_tokens: int | None = None, label: str | None = None,
) -> dict[str, Any]:
    """One block's row: the fields issue 17 names, plus what the summary needs (and the gateway's label)."""
    return {
        "cell": cell, "path": "gateway", "repeat": repeat, "wall_s": round(wall_s, 4), "requests": requests,
        "dp": dp, "gateway": label or str(dp), "ok": ok, "audio_s": audio_s, "generated_tokens": generated_tokens,
        "forced_tokens": forced_tokens,
    }


def complete(row: dict[str, Any]) -> bool:
    """Every request answered, and (where the row says) every forced token generated; the program needs all of its."""
    if row["ok"] != row["requests"] or row["wall_s"] <= 0:
        return False
    generated, forced = row.get("generated_tokens"), row.get("forced_tokens")
    if row["cell"] == PROGRAM_CELL and (generated is None or generated < PROGRAM_OUTPUT_TOKENS):
        return False
    return forced is None or (generated is not None and generated >= forced)


#: The ratios of every summary, (cell, gateway) over (cell, gateway), per repetition (`_ratios`, which says why each).
RATIOS = {
    "short": ((SHORT_CELL, "2"), (SHORT_CELL, "1")),
    "scaled": ((SCALED_CELL, "2"), (SHORT_CELL, "1")),
    "rank_scaling": ((SHORT_CELL, "2"), (HALF_CELL, "1")),
    "batch_gain": ((SHORT_CELL, "1"), (HALF_CELL, "1")),
}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per (cell, gateway), the per-repetition dp=2/dp=1 ratio of the short cell, and the targets."""
    cells: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = cells.setdefault(row["cell"], {}).setdefault(
            label_of(row), {"wall_s": [], "complete_wall_s": [], "audio_s_per_s": [], "incomplete": 0}
        )
        entry["wall_s"].append(row["wall_s"])
        entry.setdefault("running_mean_busy", []).append(
            round(sum(rank["mean_busy"] for rank in (row.get("running_per_rank") or {}).values()), 1))
        if row.get("cpu"):
            entry.setdefault("busiest_frontend_share", []).append(row["cpu"]["busiest_frontend_share"])
        if row.get("phases_ms"):
            entry.setdefault("phases_ms", []).append(row["phases_ms"])
        if row.get("counters_per_rank"):
            ranks = row["counters_per_rank"].values()
            entry.setdefault("itl_ms_per_rank", []).append([rank["itl_ms"] for rank in ranks])
            tokens = [rank["tokens"] for rank in ranks]
            entry.setdefault("rank_token_spread", []).append((max(tokens) - min(tokens)) / max(tokens) if max(tokens) else 0.0)
        if row.get("cpu", {}).get("core_share"):
            shares = row["cpu"]["core_share"]
            entry.setdefault("engine_cores", []).append(
                sum(v for role, v in shares.items() if role.startswith("engine-core") or role == "worker"))
            entry.setdefault("frontend_cpu_ms_per_request", []).append(row["cpu"]["frontend_cpu_ms_per_request"])
        steady = steady_rate(row)
        if steady is not None:
            entry.setdefault("steady_audio_s_per_s", []).append(round(row["audio_s"] * steady, 1))
        if complete(row):
            entry["complete_wall_s"].append(row["wall_s"])
            entry["audio_s_per_s"].append(row["audio_s"] * row["requests"] / row["wall_s"])
        else:
            entry["incomplete"] += 1
    for per_dp in cells.values():
        for entry in per_dp.values():
            entry["median_wall_s"] = median(entry["complete_wall_s"]) if entry["complete_wall_s"] else None
            entry["median_audio_s_per_s"] = median(entry["audio_s_per_s"]) if entry["audio_s_per_s"] else None
    out: dict[str, Any] = {"cells": cells}
    for prefix, rate in (("", wall_rate), ("steady_", steady_rate)):  # each ratio by wall time and in steady windows
        for name, (numerator, denominator) in RATIOS.items():
            per_repeat = _ratios(rows, numerator, denominator, rate=rate)
            out[f"{prefix}{name}_ratio_per_repeat"] = per_repeat
            out[f"{prefix}{name}_ratio_median"] = median(per_repeat) if per_repeat else None
    out["variants"] = variant_ratios(rows)
    out["against_variants"] = against_variants(rows)
    program = cells.get(PROGRAM_CELL, {}).get("2", {}).get("median_wall_s")
    short_ratio = out["short_ratio_median"]
    return {
        **out,
        "program_dp2_median_s": program,
        "targets": {
            "short_ratio": {"target": TARGET_RATIO, "met": None if short_ratio is None else short_ratio >= TARGET_RATIO},
            "program_dp2_s": {"target": TARGET_PROGRAM_S, "met": None if program is None else program <= TARGET_PROGRAM_S},
        },
    }


def steady_window(records: Sequence[dict[str, Any]], per_worker: int, block_start: float) -> dict[str, Any] | None:
    """Completions per second while all of a closed-loop block's streams were in their loop.

    The window opens when the last stream's first answer came back (every stream has had its ramp-up) and
    closes when the first stream got its last answer (from then on fewer streams load the gateway). A block's
    wall time also counts the ramp (all uploads and renders at once) and the drain (the slowest stream alone);
    this is the rate at the block's nominal concurrency. None when a stream has fewer than 3 answers or the
    window is empty.
    """
    ends: dict[int, list[float]] = {}
    for record in records:
        if record.get("status") == 200:
            ends.setdefault(int(record["index"]) // per_worker, []).append(float(record["t_end"]))
    if per_worker < 3 or not ends or any(len(stream) < per_worker for stream in ends.values()):
        return None
    opens = max(min(stream) for stream in ends.values())
    closes = min(max(stream) for stream in ends.values())
    inside = sum(1 for stream in ends.values() for end in stream if opens < end <= closes)
    if closes <= opens or inside == 0:
        return None
    return {"opens_s": round(opens - block_start, 3), "window_s": round(closes - opens, 3), "requests": inside,
            "requests_per_s": round(inside / (closes - opens), 3)}


def phase_medians(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median milliseconds of each `Server-Timing` phase, of the client's latency, and of what the gateway's
    total leaves of it (`outside`: upload, form parsing, queueing for the front end's loop, the answer's way back)."""
    answered = [r for r in records if r.get("status") == 200]
    phases: dict[str, list[float]] = {}
    for record in answered:
        timing = record.get("server_timing_ms") or {}
        for name, ms in timing.items():
            phases.setdefault(name, []).append(float(ms))
        phases.setdefault("client", []).append(float(record["latency_s"]) * 1000)
        if "total" in timing:
            phases.setdefault("outside", []).append(float(record["latency_s"]) * 1000 - float(timing["total"]))
    return {name: round(median(values), 1) for name, values in phases.items()}


def wall_rate(row: dict[str, Any]) -> float | None:
    """A block's requests over its wall time."""
    return row["requests"] / row["wall_s"] if complete(row) else None


def steady_rate(row: dict[str, Any]) -> float | None:
    """A block's rate inside its steady window (`steady_window`), where it has one."""
    steady = row.get("steady")
    return float(steady["requests_per_s"]) if complete(row) and steady else None


def variant_ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each variant gateway against the shipped one of its dp, per cell both ran: wall-time and steady ratios."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for label in sorted({label_of(row) for row in rows} - {"1", "2"}):
        base = gateway(label).base
        for cell in sorted({row["cell"] for row in rows if label_of(row) == label}):
            wall = _ratios(rows, (cell, label), (cell, base))
            steady = _ratios(rows, (cell, label), (cell, base), rate=steady_rate)
            if wall or steady:
                out.setdefault(label, {})[cell] = {
                    "over": base, "wall_per_repeat": wall, "wall_median": median(wall) if wall else None,
                    "steady_per_repeat": steady, "steady_median": median(steady) if steady else None,
                }
    return out


def against_variants(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The data-parallel ratios with a dp=1 variant in place of the plain dp=1 (e.g. `1-mp`, a faster one GPU):
    dp=2 at 128 over it at 128 and at 64, and its own gain from 64 to 128 streams."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for label in sorted({label_of(row) for row in rows if row["dp"] == 1} - {"1"}):
        for name, (numerator, denominator) in RATIOS.items():
            if name == "scaled":
                continue
            swap = tuple((cell, label if gateway_label == "1" else gateway_label) for cell, gateway_label in (numerator, denominator))
            per_repeat = _ratios(rows, swap[0], swap[1])
            if per_repeat:
                out.setdefault(label, {})[name] = {"per_repeat": per_repeat, "median": median(per_repeat)}
    return out


def pooled_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of several runs as one run: each run's repetitions renumbered after the previous run's, so that
    every ratio stays within one repetition of one run."""
    rows: list[dict[str, Any]] = []
    for result in results:
        offset = 1 + max((row["repeat"] for row in rows), default=-1)
        rows += [{**row, "repeat": offset + row["repeat"]} for row in result["rows"]]
    return rows


def _ratios(
    rows: list[dict[str, Any]], numerator: tuple[str, str], denominator: tuple[str, str],
    rate: Callable[[dict[str, Any]], float | None] = wall_rate,
) -> list[float]:
    """Per repetition with both blocks complete: the throughput (requests/s, by `rate`) of the `numerator`
    (cell, dp) block over the `denominator`'s.

    (short, 2) over (short, 1) is the issue's ratio at 128 streams; (scaled, 2) over (short, 1) puts the same
    batch on every GPU; (short, 2) over (half, 1) is data parallelism's own scaling (each rank of dp=2 at 128
    streams gets the 64 streams of the half cell; ideal 2.0); (short, 1) over (half, 1) is one GPU's gain
    from doubling its streams, which bounds the issue's ratio (see docs/benchmarks.md).
    """
    rates: dict[int, dict[tuple[str, str], float]] = {}
    for row in rows:
        key = (row["cell"], label_of(row))
        value = rate(row) if key in (numerator, denominator) else None
        if value is not None:
            rates.setdefault(row["repeat"], {})[key] = value
    return [
        round(r[numerator] / r[denominator], 4)
        for _, r in sorted(rates.items())
        if numerator in r and denominator in r and r[denominator] > 0
    ]


def render(summary: dict[str, Any]) -> str:
    """The markdown table for docs/benchmarks.md."""
    lines = [
        "| cell | gateway | median wall (s), complete blocks | median audio-s/s | walls (s), all blocks | incomplete blocks "
        "| running, all ranks (mean while busy) | busiest front end (share of a core) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cell, per_dp in summary["cells"].items():
        for dp, entry in sorted(per_dp.items()):
            rate = entry["median_audio_s_per_s"]
            lines.append(
                f"| {cell} | {dp} | {_fmt(entry['median_wall_s'])} | {'-' if rate is None else f'{rate:.0f}'} | "
                f"{', '.join(f'{w:.2f}' for w in entry['wall_s'])} | {entry.get('incomplete', 0)} | "
                f"{', '.join(f'{r:g}' for r in entry.get('running_mean_busy', [])) or '-'} | "
                f"{', '.join(f'{b:.2f}' for b in entry.get('busiest_frontend_share', [])) or '-'} |"
            )
    lines += phase_table(summary)
    ratio, program = summary["short_ratio_median"], summary["program_dp2_median_s"]
    lines.append("")
    lines.append(f"dp=2 / dp=1 at {SHORT_STREAMS} streams: median {_fmt(ratio)}x (target >= {TARGET_RATIO}x), "
                 f"per repetition {summary['short_ratio_per_repeat']}; program on dp=2: median {_fmt(program)} s "
                 f"(target <= {TARGET_PROGRAM_S:g} s).")
    for key, text in (
        ("scaled", f"dp=2 at {SCALED_STREAMS} streams / dp=1 at {SHORT_STREAMS} (the same batch on every GPU)"),
        ("rank_scaling", f"dp=2 at {SHORT_STREAMS} streams / dp=1 at {HALF_STREAMS} (each GPU at {HALF_STREAMS} streams: "
                         "data parallelism's own scaling, ideal 2)"),
        ("batch_gain", f"dp=1 at {SHORT_STREAMS} streams / dp=1 at {HALF_STREAMS} (one GPU's gain from twice the streams)"),
        ("steady_short", f"Steady windows (every stream in its loop): dp=2 / dp=1 at {SHORT_STREAMS} streams"),
        ("steady_rank_scaling", f"Steady windows: dp=2 at {SHORT_STREAMS} streams / dp=1 at {HALF_STREAMS}"),
        ("steady_batch_gain", f"Steady windows: dp=1 at {SHORT_STREAMS} streams / dp=1 at {HALF_STREAMS}"),
    ):
        if summary.get(f"{key}_ratio_median") is not None:
            lines.append(f"{text}: median {_fmt(summary[f'{key}_ratio_median'])}x, "
                         f"per repetition {summary[f'{key}_ratio_per_repeat']}.")
    for label, per_name in summary.get("against_variants", {}).items():
        for name, ratio in per_name.items():
            lines.append(f"With {label} as dp=1, {name}: median {_fmt(ratio['median'])}x {ratio['per_repeat']}.")
    for label, per_cell in summary.get("variants", {}).items():
        for cell, ratio in per_cell.items():
            lines.append(f"Variant {label} / {ratio['over']} on {cell}: median {_fmt(ratio['wall_median'])}x "
                         f"{ratio['wall_per_repeat']}, steady windows {_fmt(ratio['steady_median'])}x {ratio['steady_per_repeat']}.")
    return "\n".join(lines)


PHASES = ("prepare", "features", "queue", "prefill", "decode", "total", "outside", "client")


def phase_table(summary: dict[str, Any]) -> list[str]:
    """Where a short request's time went, per cell and dp: the median over repetitions of each block's median
    milliseconds (the gateway's `Server-Timing`, and the client's latency); with the steady-window rate."""
    lines = ["", "| cell | gateway | steady audio-s/s | inter-token ms per rank | rank token spread (max) "
             "| engine processes (cores) | front-end CPU (ms/request) | " + " | ".join(f"{p} (ms)" for p in PHASES) + " |",
             "| --- | --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in PHASES) + " |"]
    shown = False
    for cell, per_dp in summary["cells"].items():
        for dp, entry in sorted(per_dp.items()):
            blocks_ms = entry.get("phases_ms") or []
            if not blocks_ms and not entry.get("engine_cores"):  # rows from before Server-Timing still have their CPU
                continue
            shown = True
            steady = entry.get("steady_audio_s_per_s") or []
            values = [[b[p] for b in blocks_ms if p in b] for p in PHASES]
            itl = ", ".join("/".join(f"{ms:.1f}" for ms in block) for block in entry.get("itl_ms_per_rank", [])) or "-"
            spread = entry.get("rank_token_spread") or []
            cores = entry.get("engine_cores") or []
            frontend_ms = entry.get("frontend_cpu_ms_per_request") or []
            lines.append(f"| {cell} | {dp} | {', '.join(f'{v:.0f}' for v in steady) or '-'} | {itl} | "
                         f"{f'{100 * max(spread):.1f} %' if spread and dp.startswith('2') else '-'} | "
                         f"{f'{min(cores):.1f}-{max(cores):.1f}' if cores else '-'} | "
                         f"{f'{median(frontend_ms):.1f}' if frontend_ms else '-'} | "
                         + " | ".join(f"{median(v):.0f}" if v else "-" for v in values) + " |")
    return lines if shown else []


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plot(summary: dict[str, Any], out: Path) -> Path:
    """Bars: median audio-s/s of every short cell per dp (64, 128, 256 streams), and the program's median wall per dp."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [
        (f"{STREAMS[cell]} streams\ndp={dp}", entry["median_audio_s_per_s"] or 0.0, "#36c" if dp.startswith("2") else "#888")
        for cell in (HALF_CELL, SHORT_CELL, SCALED_CELL)
        for dp, entry in sorted(summary["cells"].get(cell, {}).items())
    ]
    # wide enough that every bar's two-line label stays clear of its neighbours'
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(9.0, 1.25 * len(bars) + 3.5), 3.4),
                                      gridspec_kw={"width_ratios": [max(2, len(bars) // 3), 1]})
    left.bar([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
    left.set_title("12 s clips x 153 tokens: median audio-s/s")
    program = summary["cells"].get(PROGRAM_CELL, {})
    dps = sorted(program)
    right.bar([f"dp={dp}" for dp in dps], [program[dp]["median_wall_s"] or 0.0 for dp in dps],
              color=["#36c" if dp.startswith("2") else "#888" for dp in dps])
    right.axhline(TARGET_PROGRAM_S, color="#c33", linestyle="--", linewidth=1)
    right.set_title("program, chunked: median wall (s)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def shared_settings(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The settings both gateways get beyond the engine's: one dict, read by `gateway_env` and `program_plan` alike.

    The chunk plan the bench forces tokens for must be the plan the gateways cut, so both come from here.
    """
    return {
        "audio": {"max_duration_s": 3000},
        "longform": {"max_duration_s": 3000, "target_s": args.chunk_target_s, "max_concurrent_chunks": 64},
        "limits": {"max_concurrent_requests": SCALED_STREAMS, "max_queued_requests": SCALED_STREAMS * args.requests_per_worker},
        "qualification": {"qualify_on_start": "false"},
    }


def program_plan(args: argparse.Namespace, pcm: Any) -> tuple[int, int]:
    """(chunks, tokens per chunk): the gateways' cut of the program and its 36,492 tokens split evenly over them."""
    from bench.program import chunk_budget
    from bench.workloads import pcm16_to_float
    from service.longform import plan_cuts
    from service.longform.policy import ChunkingPolicy
    from service.settings import GatewaySettings

    overrides = shared_settings(args)
    settings = GatewaySettings(audio=overrides["audio"], longform=overrides["longform"])
    cuts = plan_cuts(pcm16_to_float(pcm), 16_000, policy=ChunkingPolicy(**settings.chunking_defaults()), audio_sha256="bench")
    return len(cuts.cuts), chunk_budget(PROGRAM_OUTPUT_TOKENS, len(cuts.cuts))


RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"


def per_rank(metrics_text: str, metric: str = RUNNING) -> dict[str, float]:
    """One gauge (running requests by default) per engine label (rank) from one /metrics page."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith(metric + "{"):
            continue
        labels, _, value = line.rpartition(" ")
        engine = next((part.split("=", 1)[1].strip('"') for part in labels[labels.index("{") + 1: -1].split(",")
                       if part.split("=", 1)[0] == "engine"), "?")
        out[engine] = out.get(engine, 0.0) + float(value)
    return out


RANK_COUNTERS = {
    "tokens": "vllm:generation_tokens_total",
    "itl_sum_s": "vllm:inter_token_latency_seconds_sum",
    "itl_count": "vllm:inter_token_latency_seconds_count",
}


def rank_counter_deltas(before: str, after: str) -> dict[str, dict[str, float]]:
    """Per rank, between two /metrics pages: tokens generated and the mean inter-token latency (ms).

    The mean inter-token latency is the rank's step time as its requests saw it, the figure that tells a
    rank of dp=2 from dp=1's engine at the same load; the tokens say how evenly the ranks were loaded.
    """
    first = {key: per_rank(before, name) for key, name in RANK_COUNTERS.items()}
    last = {key: per_rank(after, name) for key, name in RANK_COUNTERS.items()}
    out: dict[str, dict[str, float]] = {}
    for rank in sorted(last["tokens"]):
        delta = {key: last[key].get(rank, 0.0) - first[key].get(rank, 0.0) for key in RANK_COUNTERS}
        out[rank] = {"tokens": delta["tokens"],
                     "itl_ms": round(1000 * delta["itl_sum_s"] / delta["itl_count"], 3) if delta["itl_count"] > 0 else 0.0}
    return out


async def metrics_page(url: str) -> str:
    """One /metrics page ('' when it cannot be read: the row then has no counters)."""
    async with httpx.AsyncClient(timeout=10) as client:
        try:
            return (await client.get(f"{url}/metrics")).text
        except httpx.HTTPError:
            return ""


class RankSampler:
    """Samples each rank's running and waiting requests every `period_s` while a block runs.

    Waiting requests on a rank mean its engine is the queue; few running and none waiting mean the
    requests are elsewhere (client, front ends, features) and the engine is starved.
    """

    def __init__(self, url: str, period_s: float = 0.25) -> None:
        self.url, self.period_s = url, period_s
        self.samples: list[dict[str, float]] = []
        self.waiting: list[dict[str, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        async with httpx.AsyncClient(timeout=5) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    text = (await client.get(f"{self.url}/metrics")).text
                    self.samples.append(per_rank(text, RUNNING))
                    self.waiting.append(per_rank(text, WAITING))
                await asyncio.sleep(self.period_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> dict[str, dict[str, float]]:
        """Per rank: running (max, mean while busy, samples) and the mean of waiting over the same samples."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return summarize_ranks(self.samples, self.waiting)


def summarize_ranks(
    samples: Sequence[dict[str, float]], waiting: Sequence[dict[str, float]] | None = None
) -> dict[str, dict[str, float]]:
    """Per rank: the most running requests seen, the mean over the samples where any rank ran one, and the count;
    with `waiting` (sampled alongside), also the mean of waiting requests over those same samples."""
    busy = [i for i, s in enumerate(samples) if sum(s.values()) > 0]

    def mean_busy(series: Sequence[dict[str, float]], rank: str) -> float:
        return round(sum(series[i].get(rank, 0.0) for i in busy) / len(busy), 2) if busy else 0.0

    out: dict[str, dict[str, float]] = {}
    for rank in sorted({rank for s in samples for rank in s}):
        out[rank] = {"max": max((s.get(rank, 0.0) for s in samples), default=0.0), "mean_busy": mean_busy(samples, rank),
                     "samples": len(busy)}
        if waiting is not None:
            out[rank]["waiting_mean_busy"] = mean_busy(waiting, rank)
    return out


def process_role(title: str) -> str:
    """The role of one process of a gateway's group, from its title (setproctitle'd command line)."""
    markers = (("frontend-", "frontend-"), ("EngineCore", "engine-core"), ("DPCoordinator", "dp-coordinator"), ("Worker", "worker"))
    for marker, role in markers:
        if marker in title:
            rest = title.split(marker, 1)[1].split()
            suffix = rest[0].lstrip("_") if rest else ""
            return role + (suffix if role.endswith("-") or not suffix else f"-{suffix}")
    if "bench.dp serve" in title:
        return "parent"
    return "other"


def group_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """Per process of a gateway's group (its process and all descendants): role and CPU seconds (user + system) so far."""
    out: dict[int, tuple[str, float]] = {}
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return out
    for process in members:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            out[process.pid] = (process_role(" ".join(process.cmdline()) or process.name()), times.user + times.system)
    return out


def cpu_of_block(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], wall_s: float, requests: int
) -> dict[str, Any]:
    """A block's CPU per role: seconds, share of one core over the block, and the busiest front end's share.

    Summed per process alive at the block's end, less what it had spent at the start (a process started
    during the block counts whole); one that ended during the block is left out, since summing per role
    would subtract its whole life (run e's rows show `other: -1.656`).
    A front end near 1.0 of a core is the limit of the block (one event loop per process); CPU
    milliseconds per request across the front ends say what each request costs them.
    """
    totals: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        totals[role] = totals.get(role, 0.0) + cpu - (before[pid][1] if pid in before else 0.0)
    spent = {role: round(cpu, 3) for role, cpu in totals.items()}
    frontends = {role: cpu for role, cpu in spent.items() if role.startswith("frontend-")}
    share = (lambda cpu: round(cpu / wall_s, 3)) if wall_s > 0 else (lambda cpu: 0.0)
    return {
        "cpu_s": spent,
        "core_share": {role: share(cpu) for role, cpu in spent.items()},
        "busiest_frontend_share": max((share(cpu) for cpu in frontends.values()), default=0.0),
        "frontend_cpu_ms_per_request": round(1000 * sum(frontends.values()) / requests, 2) if requests else None,
    }


#: A long pass's progress line (service.transcription.engine_pass with EngineTimings.summary), one per chunk.
CHUNK_LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO service\.transcription\.engine_pass: "
    r"(?P<request>trsc-\w+)-c(?P<chunk>\d+): (?P<done>\d+)/(?P<of>\d+) tokens(?: \((?P<summary>[^)]*)\))?$"
)


def chunk_timings(log_text: str, *, min_chunks: int = 2) -> list[dict[str, Any]]:
    """Per chunked request in a gateway log: how its chunks' features, first tokens and decodes ranged.

    Reads each chunk's last progress line. `end_spread_s` is how far apart the chunks finished (every
    chunk of the bench's program decodes the same forced tokens, so it is how far apart they started);
    logs from before the timings were logged (run c) give only that.
    """
    last: dict[str, dict[int, tuple[float, dict[str, float]]]] = {}
    for line in log_text.splitlines():
        match = CHUNK_LINE.match(line)
        if match is None:
            continue
        at = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        parts = dict(part.rsplit(" ", 2)[:2] for part in match["summary"].split(", ")) if match["summary"] else {}
        last.setdefault(match["request"], {})[int(match["chunk"])] = (at, {k: float(v) for k, v in parts.items()})
    out = []
    for request, chunks in last.items():
        if len(chunks) < min_chunks:
            continue
        ends = [at for at, _ in chunks.values()]
        row: dict[str, Any] = {"request": request, "chunks": len(chunks), "end_spread_s": round(max(ends) - min(ends), 3)}
        for name in ("features", "first token", "decode"):
            values = [parts[name] for _, parts in chunks.values() if name in parts]
            if values:
                row[name.replace(" ", "_") + "_s"] = [min(values), max(values)]
        out.append(row)
    return out


def read_log(path: Path) -> str:
    """A gateway log, plain or xz-compressed (as kept under bench/results/)."""
    return lzma.open(path, "rt", errors="replace").read() if path.suffix == ".xz" else path.read_text(errors="replace")


# -- one gateway (spawned by `run`) ---------------------------------------------------------------


def serve(allow_unqualified: bool) -> int:
    """The gateway's own app and serve path; only the gate hook differs (bench-only opening if allowed)."""
    from service.app import create_app
    from service.gate import open_gate_from_records
    from service.server import run_server
    from service.settings import GatewaySettings

    settings = GatewaySettings()

    async def on_ready(state: Any) -> None:
        await open_gate_from_records(state)
        if not state.gate.open and allow_unqualified:
            logger.warning("gate closed (%s): opened for the benchmark only as %s", state.gate.reason, UNQUALIFIED_ID)
            state.gate.open, state.gate.qualification_id, state.gate.verdict = True, UNQUALIFIED_ID, "unqualified"

    if settings.server.api_processes > 1:  # the front-end processes of service/frontends.py, same gate logic
        from bench.gateway_mp import open_gate_for_benchmark
        from service.frontends import serve_frontends

        if not allow_unqualified:
            return serve_frontends(settings)
        return serve_frontends(settings, on_ready=open_gate_for_benchmark)
    app = create_app(settings, on_ready=on_ready)
    return run_server(app, settings, host="127.0.0.1", port=settings.server.port, log_level="warning")


# -- the run --------------------------------------------------------------------------------------


def api_processes(args: argparse.Namespace, target: Gateway) -> int:
    """The front-end processes of a gateway: `--api-processes-per-rank` (or its `api<N>` tag) for each rank."""
    return (target.api_processes_per_rank or args.api_processes_per_rank) * target.dp


def devices(target: Gateway, gpus: int) -> str:
    """CUDA_VISIBLE_DEVICES of a gateway: dp=1 on GPU 0, dp=2 on 0 and 1; a dp=1 variant on the last GPU
    (GPU 1 of two: each GPU then holds two engines, as GPU 0 does with the plain pair)."""
    if target.dp > gpus:
        raise ValueError(f"gateway {target.label} needs {target.dp} GPUs; the run has {gpus}")
    if target.dp == 1 and target.label != "1":
        return str(gpus - 1)
    return ",".join(str(i) for i in range(target.dp))


def gateway_env(args: argparse.Namespace, *, target: Gateway, port: int, token: str) -> dict[str, str]:
    """The environment of one gateway: same settings for all, only dp, the devices, the front ends and a
    variant's own setting differ.

    Front-end processes scale with the ranks (`--api-processes-per-rank`), as `vllm serve` defaults its API
    server count to the data-parallel size: every rank's requests get the same front-end CPU in both.
    """
    # The bench's own MOSS_GATEWAY_* settings replace the caller's, except the build label the identity reports.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOSS_GATEWAY_") or k == REVISION_ENV}
    for section, values in shared_settings(args).items():
        env.update({f"MOSS_GATEWAY_{section.upper()}__{key.upper()}": str(value) for key, value in values.items()})
    env.update({
        "CUDA_VISIBLE_DEVICES": devices(target, args.gpus),
        "MOSS_GATEWAY_STATE_DIR": str(Path(args.state_dir) / f"dp{target.label}"),
        "MOSS_GATEWAY_ENGINE__MODEL": str(args.model),
        "MOSS_GATEWAY_SERVER__PORT": str(port),
        "MOSS_GATEWAY_SERVER__ADMIN_TOKEN": token,
        "MOSS_GATEWAY_ENGINE__DATA_PARALLEL_SIZE": str(target.dp),
        "MOSS_GATEWAY_SERVER__API_PROCESSES": str(api_processes(args, target)),
        "MOSS_GATEWAY_ENGINE__MAX_MODEL_LEN": str(args.max_model_len),
        "MOSS_GATEWAY_ENGINE__MAX_NUM_BATCHED_TOKENS": str(args.max_num_batched_tokens),
        "MOSS_GATEWAY_ENGINE__MAX_NUM_SEQS": str(args.max_num_seqs),
        "MOSS_GATEWAY_ENGINE__GPU_MEMORY_UTILIZATION": str(args.gpu_memory_utilization),
        "MOSS_GATEWAY_ENGINE__KV_CACHE_MEMORY_BYTES": str(args.kv_cache_memory_bytes),
    })
    if args.renderer_num_workers is not None:
        env["MOSS_GATEWAY_ENGINE__RENDERER_NUM_WORKERS"] = str(args.renderer_num_workers)
    threads = target.frontend_torch_threads or args.frontend_torch_threads
    if threads is not None:
        env["MOSS_GATEWAY_SERVER__FRONTEND_TORCH_THREADS"] = str(threads)
    executor = target.executor or args.distributed_executor_backend
    if executor is not None:
        env["MOSS_GATEWAY_ENGINE__DISTRIBUTED_EXECUTOR_BACKEND"] = executor
    return env


async def _client(spec: dict[str, Any], work: Path, label: str) -> dict[str, Any]:
    """One block through `python -m bench.client` (its own process: the load shares no GIL with anything)."""
    spec_path, out_path = work / f"{label}-spec.json", work / f"{label}-out.json"
    spec_path.write_text(json.dumps(spec))
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.client", str(spec_path), str(out_path), cwd=str(REPO_ROOT))
    await process.wait()
    result: dict[str, Any] = json.loads(out_path.read_text()) if out_path.exists() else {"wall_s": 0.0, "records": []}
    return result


def block_spec(
    cell: str, *, url: str, token: str, files: dict[str, list[str]], program_tokens: int,
    requests_per_worker: int = 1, processes: int = 1,
) -> dict[str, Any]:
    """The client spec of one block: 128 (or 256, or 64) streams of 12 s clips at 153 tokens, or the program once, chunked.

    Short cells: each stream sends `requests_per_worker` clips back to back, from `processes` client processes.
    `program_tokens` is per chunk (the gateway applies max_completion_tokens to each chunk).
    """
    base = {"url": url, "token": token, "response_format": "json"}
    if cell in STREAMS:
        streams = STREAMS[cell]
        return {**base, "files": files[cell][: streams * requests_per_worker], "concurrency": streams,
                "requests_per_worker": requests_per_worker, "output_tokens": SHORT_TOKENS, "processes": processes}
    return {
        **base, "files": files[PROGRAM_CELL], "concurrency": 1, "requests_per_worker": 1, "output_tokens": program_tokens,
        "chunking_strategy": json.dumps({"type": "server_vad"}),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    token = os.urandom(16).hex()
    targets = {label: gateway(label) for label in dict.fromkeys([*args.short_dp, *args.program_dp])}
    ports = {label: 18001 + i for i, label in enumerate(targets)}
    result: dict[str, Any] = {"kind": "dp", "rows": [], "args": {k: str(v) for k, v in vars(args).items()},
                              "environment": {k: os.environ[k] for k in THREAD_ENV if k in os.environ}}
    procs = {
        label: subprocess.Popen(
            [sys.executable, "-m", "bench.dp", "serve", *(["--allow-unqualified"] if args.allow_unqualified else [])],
            cwd=str(REPO_ROOT), env=gateway_env(args, target=target, port=ports[label], token=token),
            stdout=open(work / f"gateway-dp{label}.log", "wb"), stderr=subprocess.STDOUT,
        )
        for label, target in targets.items()
    }
    clips = [str(write_wav(work / f"s{i}.wav", noise_pcm16(SHORT_AUDIO_S, 1000 + i)))
             for i in range(SCALED_STREAMS * args.requests_per_worker)]
    program_pcm = noise_pcm16(PROGRAM_DURATION_S, 7)
    files = {SHORT_CELL: clips, SCALED_CELL: clips, HALF_CELL: clips, PROGRAM_CELL: [str(write_wav(work / "program.wav", program_pcm))]}
    try:
        started = time.monotonic()
        for label, port in ports.items():
            while True:
                assert procs[label].poll() is None, f"gateway {label} exited; see {work}/gateway-dp{label}.log"
                assert time.monotonic() - started < args.start_timeout_s, f"gateway {label} not ready"
                if every_frontend_ready(f"http://127.0.0.1:{port}", api_processes(args, targets[label])):
                    break
                await asyncio.sleep(1)
            result.setdefault("backend", {})[label] = httpx.get(f"http://127.0.0.1:{port}/v1/backend", timeout=30).json()
        result["ready_s"] = time.monotonic() - started
        chunks, per_chunk = program_plan(args, program_pcm)
        result["program_plan"] = {"chunks": chunks, "tokens_per_chunk": per_chunk, "forced_tokens": chunks * per_chunk,
                                  "chunk_target_s": args.chunk_target_s}
        names = blocks(short=args.short_dp, program=args.program_dp, scaled=True, half=args.half_cell)
        for label in targets:  # warm-up: every shape once on each gateway, not measured
            for cell in (SHORT_CELL, SCALED_CELL, HALF_CELL, PROGRAM_CELL):
                spec = block_spec(cell, url=f"http://127.0.0.1:{ports[label]}", token=token, files=files, program_tokens=64)
                await _client({**spec, "concurrency": 1, "requests_per_worker": 1, "processes": 1, "files": spec["files"][:1],
                               "output_tokens": 16}, work, f"warm{label}")
        for repeat, cell, label in schedule(names, args.repeats):
            if time.monotonic() - started > args.deadline_s:
                result.setdefault("skipped", []).append(f"{cell}@{label} repeat {repeat}: past the deadline")
                continue
            url = f"http://127.0.0.1:{ports[label]}"
            spec = block_spec(cell, url=url, token=token, files=files,
                              program_tokens=per_chunk, requests_per_worker=args.requests_per_worker,
                              processes=args.client_processes)
            sampler = RankSampler(url)
            page_before = await metrics_page(url)
            sampler.start()
            cpu_before = group_cpu_s(procs[label].pid)
            answer = await _client(spec, work, f"{cell}-{label}-{repeat}")
            cpu_after = group_cpu_s(procs[label].pid)
            ranks = await sampler.stop()
            counters = rank_counter_deltas(page_before, await metrics_page(url))
            records = answer.get("records", [])
            program = cell == PROGRAM_CELL
            row = dp_row(
                cell=cell, repeat=repeat, wall_s=float(answer.get("wall_s", 0.0)), requests=len(spec["files"]),
                dp=targets[label].dp, label=label,
                ok=sum(1 for r in records if r.get("status") == 200),
                audio_s=PROGRAM_DURATION_S if program else SHORT_AUDIO_S,
                generated_tokens=sum(int(r.get("header_generated_tokens") or 0) for r in records),
                forced_tokens=chunks * per_chunk if program else len(spec["files"]) * SHORT_TOKENS,
            )
            if not program:
                row.update(steady=steady_window(records, args.requests_per_worker, float(answer.get("t_start", 0.0))),
                           phases_ms=phase_medians(records))
            row.update(running_per_rank=ranks, counters_per_rank=counters, client_processes=answer.get("processes", 1),
                       shard_walls_s=answer.get("shard_walls_s"), api_processes=api_processes(args, targets[label]),
                       cpu=cpu_of_block(cpu_before, cpu_after, row["wall_s"], row["requests"]))
            result["rows"].append(row)
            Path(args.out).write_text(json.dumps(result, indent=1))
            logger.info("%s", result["rows"][-1])
    finally:
        for process in procs.values():
            process.terminate()
        for process in procs.values():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    result["summary"] = summarize(result["rows"])
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(render(result["summary"]))
    return result


def gateway_labels(text: str) -> list[str]:
    """A comma-separated list of gateway labels from the command line ("" is none); each must parse (`gateway`)."""
    labels = [x for x in text.split(",") if x]
    for label in labels:
        gateway(label)
    return labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dp", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--api-processes-per-rank", type=int, default=4,
                   help="front-end processes per data-parallel rank (server.api_processes = this x dp)")
    r.add_argument("--no-half-cell", dest="half_cell", action="store_false",
                   help=f"skip dp=1 at {HALF_STREAMS} streams (the per-GPU load of dp=2 at {SHORT_STREAMS})")
    r.add_argument("--program-dp", type=gateway_labels, default=["2", "1"],
                   help="the gateways (labels, see Gateway) of the program per repetition (dp=1 for comparison, if time allows)")
    r.add_argument("--short-dp", type=gateway_labels, default=["1", "2"],
                   help="the gateways (labels: 1, 2, or a variant such as 1-mp, 2-uni, 1-fe32, 2-api8) of the 128-stream "
                        "cell; the 256-stream cell runs on those with dp=2, the 64-stream cell on those with dp=1; empty: none")
    r.add_argument("--gpus", type=int, default=2, help="GPUs of the host (a dp=1 variant runs on the last)")
    r.add_argument("--renderer-num-workers", type=int, default=None,
                   help="both gateways' engine.renderer_num_workers (unset: the gateway's default)")
    r.add_argument("--frontend-torch-threads", type=int, default=None,
                   help="both gateways' server.frontend_torch_threads (unset: the gateway's default)")
    r.add_argument("--distributed-executor-backend", choices=("mp", "uni"), default=None,
                   help="both gateways' engine.distributed_executor_backend (unset: vLLM's choice, 'mp' for dp > 1)")
    r.add_argument("--state-dir", default="/tmp/bench-dp-state")
    r.add_argument("--work-dir", default="/tmp/bench-dp-work")
    r.add_argument("--max-model-len", type=int, default=131072)
    r.add_argument("--max-num-batched-tokens", type=int, default=40960)
    r.add_argument("--max-num-seqs", type=int, default=128)
    r.add_argument("--gpu-memory-utilization", type=float, default=0.40)
    r.add_argument("--kv-cache-memory-bytes", type=int, default=24 << 30)
    r.add_argument("--start-timeout-s", type=float, default=300.0)
    r.add_argument("--deadline-s", type=float, default=480.0)
    r.add_argument("--allow-unqualified", action="store_true")
    r.add_argument("--requests-per-worker", type=int, default=2, help="clips each stream sends back to back (short cells)")
    r.add_argument("--client-processes", type=int, default=8, help="client processes the short cells' load is split over")
    r.add_argument("--chunk-target-s", type=float, default=290.0, help="the gateways' chunk length (longform.target_s)")
    p = sub.add_parser("report", help="one run's tables, or several runs' rows pooled (repetitions kept apart)")
    p.add_argument("file", type=Path, nargs="+")
    p.add_argument("--plot", type=Path, default=None)
    c = sub.add_parser("chunks", help="per chunked request in gateway logs: features, first token, decode, end spread")
    c.add_argument("logs", type=Path, nargs="+")
    s = sub.add_parser("serve")
    s.add_argument("--allow-unqualified", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the rank sampler polls /metrics four times a second
    if args.command == "serve":
        return serve(args.allow_unqualified)
    if args.command == "chunks":
        for log in args.logs:
            for row in chunk_timings(read_log(log)):
                print(json.dumps({"log": log.name, **row}))
        return 0
    if args.command == "report":
        summary = summarize(pooled_rows([json.loads(path.read_text()) for path in args.file]))
        print(render(summary))
        if args.plot:
            print(f"wrote {plot(summary, args.plot)}", file=sys.stderr)
        return 0
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
