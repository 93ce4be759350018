"""`python -m bench report --plots`: the figures exist and draw exactly the rows given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.container import BarContainer

from bench import __main__ as bench_main
from bench import plots


def _row(path: str, concurrency: int, duration_s: float, audio_s_per_s: float, rtf: float, **extra: Any) -> dict[str, Any]:
    return {
        "cell": f"c-{duration_s:g}s-c{concurrency}", "workload": "synthetic", "path": path, "stream": False,
        "duration_s": duration_s, "concurrency": concurrency, "requests": concurrency * 2,
        "audio_s_per_s": audio_s_per_s, "rtf_mean": rtf, **extra,
    }


ROWS = [
    _row("direct", 1, 12.0, 30.0, 0.040),
    _row("gateway", 1, 12.0, 28.0, 0.043),
    _row("direct", 4, 12.0, 100.0, 0.050),
    _row("gateway", 4, 12.0, 90.0, 0.055),
    _row("direct", 16, 12.0, 300.0, 0.070),
    _row("gateway", 16, 12.0, 210.0, 0.090),
    _row("direct", 1, 600.0, 27.0, 0.037),
    _row("gateway", 1, 600.0, 26.0, 0.038),
    _row("transformers", 1, 12.0, 1.2, 0.84),
    _row("gateway", 16, 12.0, 999.0, 0.5, stream=True),  # streamed: another client, left out
]


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "results" / "synthetic-run" / "rows.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"kind": "bench", "rows": ROWS}))
    (path.parent / "qualification-q-1.json").write_text(json.dumps({"verdict": "identical"}))  # no rows: ignored
    # Another tool's rows (no `cell`, no `path`): not benchmark rows, ignored (regression: the report raised KeyError).
    (path.parent / "render_spread.json").write_text(json.dumps({"kind": "render_spread", "rows": [{"workers": 1, "spread_s": 1.9}]}))
    return path


def _lines(figure: Any) -> dict[str, tuple[list[float], list[float]]]:
    (ax,) = figure.axes
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_throughput_lines_are_the_rows(rows_file: Path) -> None:
    other = rows_file.parent / "render_spread.json"
    runs = plots.runs_of([(rows_file, json.loads(rows_file.read_text())), (other, json.loads(other.read_text()))])
    assert [run.label for run in runs] == ["synthetic-run"] and len(runs[0].rows) == len(ROWS) - 1
    figure = plots.throughput_figure(runs)
    assert figure.axes[0].get_title() == "synthetic-run"
    # 600 s clips were measured at one concurrency only: no line; the streamed row is left out.
    assert _lines(figure) == {
        "direct, 12 s clips": ([1, 4, 16], [30.0, 100.0, 300.0]),
        "gateway, 12 s clips": ([1, 4, 16], [28.0, 90.0, 210.0]),
    }


def test_rtf_bars_are_the_rows_side_by_side(rows_file: Path) -> None:
    runs = plots.runs_of([(rows_file, json.loads(rows_file.read_text()))])
    (ax,) = plots.rtf_figure(runs).axes
    bars = {c.get_label(): c for c in ax.containers if isinstance(c, BarContainer)}
    assert list(bars) == ["direct", "gateway", "transformers"]
    heights = {path: [patch.get_height() for patch in bars[path].patches] for path in bars}
    assert heights == {"direct": [0.040, 0.037], "gateway": [0.043, 0.038], "transformers": [0.84]}
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["12 s", "10 min"]
    # Side by side: at each length the gateway's bar sits right of the direct one and does not overlap it.
    for direct, gateway in zip(bars["direct"].patches, bars["gateway"].patches, strict=True):
        assert np.isclose(direct.get_x() + direct.get_width(), gateway.get_x())


def test_report_plots_writes_the_figures(rows_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "docs"
    files = [str(rows_file), str(rows_file.parent / "qualification-q-1.json"), str(rows_file.parent / "render_spread.json")]
    assert bench_main.main(["report", *files, "--plots", "--plots-dir", str(out)]) == 0
    captured = capsys.readouterr()
    assert "c-12s-c16" in captured.out  # the table is still printed
    for name in (plots.THROUGHPUT_FILE, plots.RTF_FILE):
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
        assert f"wrote {out / name}" in captured.err


def test_no_rows_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no benchmark rows"):
        plots.draw([(tmp_path / "q.json", {"verdict": "identical"})], tmp_path)
