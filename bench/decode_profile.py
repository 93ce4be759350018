"""Seconds per decode step against context length, and a torch-profiler trace in a few numbers.

Pure functions (no engine, no GPU), used by ``bench.program`` on the device and by its tests:

* ``fit_step_time``: per-token arrival times of one stream (vLLM ``DELTA`` outputs) -> seconds per
  decode step (least-squares slope of time against tokens, after the first few);
* ``counter_curve``: samples of vLLM's ``vllm:generation_tokens`` counter taken during a long run ->
  seconds per step in windows, each with its context length (prompt plus tokens so far);
* ``fit_linear`` / ``predict_decode_s``: s/step = a + b * context, and the decode time of a forced
  output of N tokens after a prompt of P tokens under that line;
* ``summarize_trace``: a Chrome trace of the torch profiler (vLLM's worker) -> time per kernel class
  (attention, GEMM, sampling, ...), the GPU's busy time and the gaps between kernels (host time the GPU
  waited for), per decode step;
* ``render_profile_md`` and ``plot_step_curves`` (matplotlib imported only when plotting).
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# -- seconds per step ---------------------------------------------------------------------------


def fit_step_time(samples: Sequence[tuple[float, int]], *, skip_tokens: int = 8) -> dict[str, Any] | None:
    """Seconds per decode step from (time, tokens generated so far) of one stream.

    Updates may carry several tokens (the front end coalesces when it falls behind), so the
    slope of time against tokens is fitted, not the mean gap. The first `skip_tokens` tokens
    (the prefill's first token and the first steps after it) are left out.
    """
    points = [(float(t), int(n)) for t, n in samples if int(n) > skip_tokens]
    if len(points) < 3 or points[-1][1] - points[0][1] < 2:
        return None
    ns = [float(n) for _, n in points]
    ts = [t for t, _ in points]
    slope, intercept = _least_squares(ns, ts)
    gaps = sorted((t1 - t0) / (n1 - n0) for (t0, n0), (t1, n1) in zip(points, points[1:], strict=False) if n1 > n0)
    return {
        "s_per_step": slope,
        "intercept_s": intercept,
        "s_per_step_median_gap": gaps[len(gaps) // 2] if gaps else None,
        "tokens_fitted": int(points[-1][1] - points[0][1]),
        "updates": len(points),
    }


def counter_curve(
    samples: Sequence[tuple[float, float]],
    *,
    prompt_tokens: float,
    streams: int = 1,
    min_tokens: int = 64,
) -> list[dict[str, float]]:
    """Windows of (time, cumulative generated tokens over all streams) -> s/step against context.

    The first window opens at the first sample after the counter first moved (the upload and the
    prefill before it are not decode steps); a window closes once it holds at least `min_tokens`
    tokens per stream; the unfinished last window is dropped. Each window's context is the prompt plus
    the tokens each stream had generated at its middle, so it suits `streams` equal requests run together.
    """
    rows: list[dict[str, float]] = []
    if streams < 1:
        raise ValueError("streams must be at least 1")
    if not samples:
        return rows
    idle = samples[0][1]
    start: tuple[float, float] | None = None
    for t, total in samples:
        if start is None:
            if total != idle:
                start = (t, total)
            continue
        tokens = (total - start[1]) / streams
        if tokens < 0:  # a counter reset: begin again
            start = (t, total)
            continue
        if tokens >= min_tokens:
            middle = (start[1] + total) / 2.0 / streams
            rows.append(
                {
                    "t_s": (start[0] + t) / 2.0,
                    "context_tokens": prompt_tokens + middle,
                    "s_per_step": (t - start[0]) / tokens,
                    "steps": tokens,
                }
            )
            start = (t, total)
    return rows


def fit_linear(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float] | None:
    """y = a + b x by least squares (None with fewer than two distinct x)."""
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    b, a = _least_squares([float(x) for x in xs], [float(y) for y in ys])
    mean = sum(ys) / len(ys)
    ss_tot = sum((y - mean) ** 2 for y in ys)
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    return {"a_s": a, "b_s_per_token": b, "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0, "points": len(xs)}


def predict_decode_s(a_s: float, b_s_per_token: float, *, prompt_tokens: int, output_tokens: int) -> float:
    """Decode time of `output_tokens` steps after `prompt_tokens`, each step a + b * context."""
    n = output_tokens
    return n * a_s + b_s_per_token * (n * prompt_tokens + n * (n - 1) / 2.0)


def _least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("all x equal")
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    return slope, my - slope * mx


def bin_curve(rows: Iterable[dict[str, float]], *, width: float = 2048.0) -> list[dict[str, float]]:
    """Windows grouped by context (bins of `width` tokens): step-weighted mean s/step per bin."""
    bins: dict[int, list[float]] = {}
    for row in rows:
        key = int(row["context_tokens"] // width)
        acc = bins.setdefault(key, [0.0, 0.0, 0.0])
        steps = float(row.get("steps", 1.0))
        acc[0] += row["s_per_step"] * steps
        acc[1] += steps
        acc[2] += row["context_tokens"] * steps
    return [
        {"context_tokens": acc[2] / acc[1], "s_per_step": acc[0] / acc[1], "steps": acc[1]}
        for _, acc in sorted(bins.items())
        if acc[1] > 0
    ]


# -- the profiler trace ------------------------------------------------------------------------

#: Kernel classes, first match wins (names as CUPTI reports them: FA3, Triton, cuBLAS/CUTLASS, Inductor).
KERNEL_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("kv_cache_write", re.compile(r"reshape_and_cache|concat_and_cache", re.I)),
    ("attention", re.compile(r"flash|fmha|attn|attention|reduce_segments|paged", re.I)),
    ("sampling", re.compile(r"argmax|argsort|topk|top_k|sort|sampl|gumbel|multinomial|exponential|log_softmax|softmax", re.I)),
    ("gemm", re.compile(r"gemm|gemv|cutlass|cublas|xmma|nvjet|matmul|mm_|_mm|dot_|splitk|sm90_", re.I)),
    ("norm_rope_act", re.compile(r"rms_norm|layer_norm|layernorm|rotary|rope|silu|gelu|act_and_mul", re.I)),
    ("fused_elementwise", re.compile(r"triton_|elementwise|vectorized|unrolled|reduce_kernel|index|copy|fill|cat", re.I)),
)


#: Attention kernels that are not one call per layer (split-KV combine, FA3's scheduler metadata).
_NOT_PER_LAYER = re.compile(r"combine|reduce|merge|prepare|metadata|scheduler", re.I)


def _outer_name(name: str, depth: int = 2) -> str:
    """The kernel's name without deep template arguments: FA3's main kernel carries a `TileScheduler`
    deep in its template, which must not make it look like a per-step helper kernel."""
    kept, level = [], 0
    for char in name:
        if char == "<":
            level += 1
        if level <= depth:
            kept.append(char)
        if char == ">":
            level = max(0, level - 1)
    return "".join(kept)


def classify_kernel(name: str) -> str:
    for label, pattern in KERNEL_CLASSES:
        if pattern.search(name):
            return label
    return "other"


def load_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
        document: dict[str, Any] = json.load(handle)
    return document


def interval_union(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None and current_start is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None and current_start is not None:
        total += current_end - current_start
    return total


def summarize_trace(
    trace: dict[str, Any], *, num_layers: int, steps: int | None = None, top: int = 15
) -> dict[str, Any]:
    """Time per kernel class, GPU busy time and host gaps of a profiled window of decode steps.

    `steps`: decode steps in the window; unset, the attention kernels' count over `num_layers`
    (one attention call per layer and step; split-KV combine kernels and FA3's scheduler-metadata
    kernel are not counted).
    Times in the result are microseconds (the trace's unit) unless the key says otherwise.
    """
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    kernels: list[tuple[float, float, str]] = []
    memcpy: list[tuple[float, float]] = []
    annotations: dict[str, list[float]] = {}
    runtime: dict[str, list[float]] = {}
    for event in events:
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        cat = str(event.get("cat", "")).lower()
        ts, dur = float(event.get("ts", 0.0)), float(event.get("dur", 0.0))
        name = str(event.get("name", ""))
        if cat == "kernel":
            kernels.append((ts, ts + dur, name))
        elif cat in ("gpu_memcpy", "gpu_memset"):
            memcpy.append((ts, ts + dur))
        elif cat == "cuda_runtime" or cat == "cuda_driver":
            entry = runtime.setdefault(name, [0.0, 0.0])
            entry[0] += 1
            entry[1] += dur
        elif cat in ("user_annotation", "gpu_user_annotation"):
            entry = annotations.setdefault(f"{cat}:{name}", [0.0, 0.0])
            entry[0] += 1
            entry[1] += dur
    if not kernels:
        return {"error": "no GPU kernels in the trace", "events": len(events)}
    by_class: dict[str, dict[str, float]] = {}
    by_name: dict[str, list[float]] = {}
    attention_main = 0
    for start, end, name in kernels:
        label = classify_kernel(name)
        acc = by_class.setdefault(label, {"us": 0.0, "count": 0})
        acc["us"] += end - start
        acc["count"] += 1
        entry = by_name.setdefault(name, [0.0, 0.0])
        entry[0] += 1
        entry[1] += end - start
        if label == "attention" and not _NOT_PER_LAYER.search(_outer_name(name)):
            attention_main += 1
    gpu_intervals = [(s, e) for s, e, _ in kernels] + memcpy
    window_start = min(s for s, _ in gpu_intervals)
    window_end = max(e for _, e in gpu_intervals)
    wall = window_end - window_start
    busy = interval_union(gpu_intervals)
    if steps is None:
        steps = max(1, round(attention_main / max(1, num_layers)))
    kernel_sum = sum(acc["us"] for acc in by_class.values())
    classes = {
        label: {
            "us_total": acc["us"],
            "count": int(acc["count"]),
            "us_per_step": acc["us"] / steps,
            "share_of_wall": acc["us"] / wall if wall > 0 else None,
        }
        for label, acc in sorted(by_class.items(), key=lambda item: -item[1]["us"])
    }
    top_kernels = [
        {"name": name[:120], "class": classify_kernel(name), "count": int(v[0]), "us_total": v[1], "us_per_step": v[1] / steps}
        for name, v in sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    ]
    top_runtime = [
        {"name": name, "count": int(v[0]), "us_total": v[1], "us_per_step": v[1] / steps}
        for name, v in sorted(runtime.items(), key=lambda item: -item[1][1])[:8]
    ]
    top_annotations = [
        {"name": name[:120], "count": int(v[0]), "us_total": v[1], "us_per_step": v[1] / steps}
        for name, v in sorted(annotations.items(), key=lambda item: -item[1][1])[:12]
    ]
    return {
        "steps": steps,
        "kernels": len(kernels),
        "kernels_per_step": len(kernels) / steps,
        "wall_us": wall,
        "wall_us_per_step": wall / steps,
        "gpu_busy_us_per_step": busy / steps,
        "host_gap_us_per_step": (wall - busy) / steps,
        "kernel_sum_us_per_step": kernel_sum / steps,
        "gpu_busy_share": busy / wall if wall > 0 else None,
        "classes": classes,
        "top_kernels": top_kernels,
        "cuda_runtime": top_runtime,
        "annotations": top_annotations,
    }


def render_profile_md(summary: dict[str, Any], *, title: str = "Decode-step profile") -> str:
    """A small Markdown table of a `summarize_trace` result (per decode step, microseconds)."""
    if "error" in summary:
        return f"### {title}\n\n{summary['error']}\n"
    lines = [
        f"### {title}",
        "",
        f"{summary['steps']} decode steps; {summary['kernels_per_step']:.0f} kernels a step; "
        f"wall {summary['wall_us_per_step']:.0f} µs a step, GPU busy {summary['gpu_busy_us_per_step']:.0f} µs "
        f"({100 * (summary['gpu_busy_share'] or 0):.0f} %), gaps (GPU idle, waiting for the host) "
        f"{summary['host_gap_us_per_step']:.0f} µs.",
        "",
        "| class | µs a step | share of wall | kernels |",
        "| --- | --- | --- | --- |",
    ]
    for label, row in summary["classes"].items():
        share = row["share_of_wall"]
        lines.append(
            f"| {label} | {row['us_per_step']:.1f} | {'-' if share is None else f'{100 * share:.1f} %'} | {row['count']} |"
        )
    lines.append(f"| host gaps (wall - GPU busy) | {summary['host_gap_us_per_step']:.1f} | "
                 f"{100 * (1 - (summary['gpu_busy_share'] or 0)):.1f} % | - |")
    lines += ["", "| top kernels | class | µs a step | count |", "| --- | --- | --- | --- |"]
    for row in summary["top_kernels"]:
        name = row["name"].replace("|", "/")[:90]
        lines.append(f"| `{name}` | {row['class']} | {row['us_per_step']:.1f} | {row['count']} |")
    if summary.get("annotations"):
        lines += ["", "| host annotations | µs a step | count |", "| --- | --- | --- |"]
        for row in summary["annotations"]:
            lines.append(f"| `{row['name'].replace('|', '/')[:90]}` | {row['us_per_step']:.1f} | {row['count']} |")
    return "\n".join(lines) + "\n"


# -- the plot -------------------------------------------------------------------------------------


def plot_series(result: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """What the plot draws: label -> [(context tokens, ms a step)], from a `bench.program` result."""
    series: dict[str, list[tuple[float, float]]] = {}
    for row in result.get("probes", []):
        if row.get("s_per_step") is None or row.get("context_tokens") is None:
            continue
        series.setdefault(f"probe: {row['choice']}", []).append((float(row["context_tokens"]), 1000.0 * row["s_per_step"]))
    for row in result.get("rows", []):
        curve = row.get("step_curve") or []
        if curve:
            label = f"{row['cell']} ({row.get('choice', '?')}, {row.get('streams', 1)} streams)"
            series[label] = [(float(p["context_tokens"]), 1000.0 * p["s_per_step"]) for p in curve]
    return {label: sorted(points) for label, points in series.items()}


def plot_step_curves(result: dict[str, Any], path: Path, *, bound: dict[str, float] | None = None) -> Path:
    """seconds per decode step against context length (matplotlib, Agg), written to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = plot_series(result)
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in series.items():
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        style = "o" if label.startswith("probe") else "-"
        ax.plot(xs, ys, style, label=label, markersize=4)
    if bound:
        top = max((p[0] for pts in series.values() for p in pts), default=80_000.0)
        xs = [0.0, top]
        ax.plot(xs, [1000.0 * (bound["a_s"] + bound["b_s_per_token"] * x) for x in xs], "k--", label="bandwidth bound")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("ms per decode step")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def bandwidth_bound_line(*, weight_bytes: float, kv_bytes_per_token: float, bandwidth: float = 4.8e12) -> dict[str, float]:
    """The bound as a line: each step reads the weights and the KV cache once."""
    return {"a_s": weight_bytes / bandwidth, "b_s_per_token": kv_bytes_per_token / bandwidth}


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
