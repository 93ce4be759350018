"""The benchmark figures for docs/benchmarks.md, drawn from the result rows with matplotlib.

Why figures next to the tables: the gateway's cost shows as a gap that opens with
concurrency, and the engine's speed as RTF falling with audio length; both read at
a glance in a picture and only with arithmetic in a table. Each figure has one
panel per run (a folder under bench/results/), and within a panel the paths of the
same cell side by side: `gateway` against `direct` (and `direct-final`, `raw`,
`transformers` where the run has them). Streamed rows (SSE) are left out: they
measure a different client.

Uses matplotlib's object API with the Agg canvas (no pyplot, no display, no global
backend switch), so it runs headless and in tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bench.report import benchmark_rows

#: Drawing order and colour of each path; unknown paths come after, in grey.
PATH_STYLE: dict[str, str] = {
    "direct": "#1f77b4",
    "gateway": "#d62728",
    "gateway-mp": "#8c564b",
    "vllm-serve": "#17becf",
    "direct-final": "#2ca02c",
    "raw": "#9467bd",
    "transformers": "#ff7f0e",
}
THROUGHPUT_FILE = "bench-throughput.png"
RTF_FILE = "bench-rtf.png"


@dataclass(frozen=True)
class Run:
    """The rows of one run (every result file of one folder), labelled by the folder's name."""

    label: str
    rows: tuple[dict[str, Any], ...]


def runs_of(results: Sequence[tuple[Path, dict[str, Any]]]) -> list[Run]:
    """Group result files by their folder; files without benchmark rows (qualification records, other tools') add nothing."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for path, result in results:
        rows = [row for row in benchmark_rows(result) if not row.get("stream")]
        if rows:
            grouped.setdefault(path.parent.name, []).extend(rows)
    return [Run(label, tuple(rows)) for label, rows in sorted(grouped.items())]


def _paths(rows: Sequence[dict[str, Any]]) -> list[str]:
    present = {row["path"] for row in rows}
    return [p for p in PATH_STYLE if p in present] + sorted(present - PATH_STYLE.keys())


def _seconds(value: float) -> str:
    return f"{value:g} s" if value < 120 else f"{value / 60:.4g} min"


def throughput_series(run: Run) -> dict[tuple[str, float], list[tuple[int, float]]]:
    """(path, audio length) -> [(concurrency, audio seconds per second)], concurrency ascending.

    Only series measured at two concurrencies or more: a single point has no trend
    against concurrency (it is in the RTF figure instead).
    """
    series: dict[tuple[str, float], list[tuple[int, float]]] = {}
    for row in run.rows:
        if row.get("audio_s_per_s") is None or row.get("concurrency") is None or row.get("duration_s") is None:
            continue
        series.setdefault((row["path"], float(row["duration_s"])), []).append(
            (int(row["concurrency"]), float(row["audio_s_per_s"]))
        )
    return {
        key: sorted(points)
        for key, points in sorted(series.items(), key=lambda item: (item[0][1], item[0][0]))
        if len({concurrency for concurrency, _ in points}) >= 2
    }


def rtf_table(run: Run) -> dict[str, dict[float, float]]:
    """path -> audio length -> mean RTF, at concurrency 1 (one request at a time)."""
    table: dict[str, dict[float, float]] = {}
    for row in run.rows:
        if row.get("concurrency") != 1 or row.get("rtf_mean") is None or row.get("duration_s") is None:
            continue
        table.setdefault(row["path"], {})[float(row["duration_s"])] = float(row["rtf_mean"])
    return table


def _figure(panels: int) -> tuple[Figure, list[Any]]:
    figure = Figure(figsize=(6.2 * panels, 4.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, panels, squeeze=False)[0]
    return figure, list(axes)


def throughput_figure(runs: Sequence[Run]) -> Figure:
    """Audio seconds transcribed per second against concurrency, one line per path and audio length."""
    figure, axes = _figure(len(runs))
    dashes = ["-", "--", ":", "-."]
    for ax, run in zip(axes, runs, strict=True):
        series = throughput_series(run)
        lengths = sorted({length for _, length in series})
        for path in _paths(run.rows):
            for index, length in enumerate(lengths):
                points = series.get((path, length))
                if not points:
                    continue
                xs, ys = zip(*points, strict=True)
                ax.plot(
                    xs, ys, marker="o", linestyle=dashes[index % len(dashes)],
                    color=PATH_STYLE.get(path, "#7f7f7f"), label=f"{path}, {_seconds(length)} clips",
                )
        ax.set_xscale("log", base=2)
        levels = sorted({concurrency for points in series.values() for concurrency, _ in points})
        ax.set_xticks(levels, [str(level) for level in levels])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("audio seconds per second")
        ax.set_title(run.label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    figure.suptitle("Throughput against concurrency")
    return figure


def rtf_figure(runs: Sequence[Run]) -> Figure:
    """Real-time factor at one request against audio length; paths as bars side by side."""
    figure, axes = _figure(len(runs))
    every = [rtf for run in runs for by_length in rtf_table(run).values() for rtf in by_length.values()]
    # One log range for every panel, so that bars of different runs compare by eye.
    limits = (min(every) / 2, max(every) * 2) if every else (1e-3, 1.0)
    for ax, run in zip(axes, runs, strict=True):
        table = rtf_table(run)
        lengths = sorted({length for by_length in table.values() for length in by_length})
        paths = [p for p in _paths(run.rows) if p in table]
        width = 0.8 / max(1, len(paths))
        for offset, path in enumerate(paths):
            slots = [i for i, length in enumerate(lengths) if length in table[path]]
            bars = ax.bar(
                [i - 0.4 + width * (offset + 0.5) for i in slots],
                [table[path][lengths[i]] for i in slots],
                width=width, color=PATH_STYLE.get(path, "#7f7f7f"), label=path,
            )
            ax.bar_label(bars, fmt="%.2g", fontsize=6.5, padding=2)
        ax.set_xticks(range(len(lengths)), [_seconds(length) for length in lengths])
        ax.set_yscale("log")
        ax.set_ylim(*limits)
        ax.set_xlabel("audio length")
        ax.set_ylabel("real-time factor (lower is faster)")
        ax.set_title(run.label)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize="small")
    figure.suptitle("Real-time factor against audio length, one request at a time")
    return figure


def draw(results: Sequence[tuple[Path, dict[str, Any]]], out_dir: Path) -> list[Path]:
    """Write both figures as PNG into `out_dir`; returns their paths."""
    runs = runs_of(results)
    if not runs:
        raise ValueError("no benchmark rows in the given result files")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, figure in ((THROUGHPUT_FILE, throughput_figure(runs)), (RTF_FILE, rtf_figure(runs))):
        path = out_dir / name
        figure.savefig(path, dpi=110)
        written.append(path)
    return written
