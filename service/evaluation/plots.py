"""The report's plots (matplotlib, headless `Agg`): per-window CER, coverage and drift over time.

One PNG per track and kind, so that a plot never puts two tracks on one axis:
`cer_<track>.png` (CER of each window, by its start in the program; whole items
by their order when there are no windows), `coverage_<track>.png` (per unit, the
share of gold speech covered in each time bin) and `drift_<track>.png` (per
unit, hypothesis minus gold start of each paired turn, against gold time).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any


def _pyplot() -> ModuleType:
    """matplotlib's pyplot on the headless Agg backend.

    Imported on use: matplotlib is the evaluation extra's (the serving images leave it out, and their
    CLI imports this package), and the backend must be chosen before pyplot is first imported.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def _units(section: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in section["items"] if item["status"] == "ok"]


def plot_cer(track: str, section: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    units = [u for u in _units(section) if u.get("cer") is not None]
    figure, axes = plt.subplots(figsize=(8, 3.5))
    windowed = [u for u in units if u["kind"] == "window"]
    if windowed:
        for item_id in sorted({u["item"] for u in windowed}):
            rows = sorted((u["window"]["start_s"] / 60, u["cer"] * 100) for u in windowed if u["item"] == item_id)
            axes.plot([r[0] for r in rows], [r[1] for r in rows], marker="o", label=item_id)
        axes.set_xlabel("window start (min)")
        axes.legend(fontsize="small")
    else:
        axes.bar(range(len(units)), [u["cer"] * 100 for u in units])
        axes.set_xticks(range(len(units)), [u["id"] for u in units], rotation=30, ha="right", fontsize="small")
    axes.set_ylabel("CER (%)")
    axes.set_title(f"CER per window, {track} track")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_coverage(track: str, section: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 3.5))
    for unit in _units(section):
        rows = [(r["start_s"] / 60, r["coverage"] * 100) for r in unit.get("coverage_over_time") or [] if r["coverage"] is not None]
        if rows:
            axes.step([r[0] for r in rows], [r[1] for r in rows], where="post", label=unit["id"])
    axes.set_xlabel("time in unit (min)")
    axes.set_ylabel("gold speech covered (%)")
    axes.set_ylim(-5, 105)
    axes.set_title(f"Coverage over time, {track} track")
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="x-small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_drift(track: str, section: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 3.5))
    for unit in _units(section):
        drift = unit.get("drift") or []
        if drift:
            axes.plot([t / 60 for t, _ in drift], [d for _, d in drift], marker=".", linestyle="-", label=unit["id"])
    axes.axhline(0, color="grey", linewidth=0.8)
    axes.set_xlabel("gold time (min)")
    axes.set_ylabel("hypothesis − gold start (s)")
    axes.set_title(f"Timestamp drift, {track} track")
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="x-small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    written = []
    for track, section in report["tracks"].items():
        for name, draw in (("cer", plot_cer), ("coverage", plot_coverage), ("drift", plot_drift)):
            path = out / f"{name}_{track}.png"
            draw(track, section, path)
            written.append(path)
    return written
