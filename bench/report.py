"""Tables from result files: a plain one for the terminal, Markdown for docs/benchmarks.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import protocol
from bench.checkpoint import decoder_weight_bytes, kv_bytes_per_token
from bench.workloads import PROGRAM_OUTPUT_TOKENS

#: Measured before on the same kind of host with a plain script (shared/facts/bench-host.md):
#: cell -> (what, value, unit). The 12 s case there generated 150 tokens (153 here).
BASELINES: dict[str, dict[str, Any]] = {
    "short-12s-c1": {"latency_s": 0.279, "output_tokens_per_s": 537, "note": "LLM.generate, 150 out"},
    "short-12s-c16": {"audio_s_per_s": 268, "wall_s_per_wave": 0.716, "note": "16 at once, one wave"},
    "long-300s-c1-1000out": {"latency_s": 2.17, "output_tokens_per_s": 462},
    "long-600s-c8": {"audio_s_per_s": 144.7, "wall_s_per_wave": 33.2},
    "program-2861.5s-c1": {"latency_s": 119.6, "output_tokens_per_s": 305},
    "reference-12s-c1": {"latency_s": 3.81, "output_tokens_per_s": 39, "note": "Transformers, 150 out"},
    "reference-300s-c1-1000out": {"latency_s": 75.8, "output_tokens_per_s": 13.2},
}

#: The bound of bench-host.md for the program at one stream (HBM bandwidth 4.8 TB/s).
HBM_BYTES_PER_S = 4.8e12


def program_bound_s(
    prompt_tokens: int = 37_979, output_tokens: int = PROGRAM_OUTPUT_TOKENS, kv_bytes: int | None = None
) -> float:
    """Each decode step reads the decoder weights plus the whole KV cache so far."""
    per_token = kv_bytes or kv_bytes_per_token()
    weights = decoder_weight_bytes()
    mean_context = prompt_tokens + output_tokens / 2.0
    return output_tokens * (weights + mean_context * per_token) / HBM_BYTES_PER_S


def load(paths: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(Path(p).read_text()) for p in paths]


def _f(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.1f}"
        return f"{value:.{digits}f}"
    return str(value)


def _pct(ratio: Any) -> str:
    return "-" if ratio is None else f"{(ratio - 1) * 100:+.1f} %"


def _gib(value: Any) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


COLUMNS = (
    ("cell", "cell"),
    ("path", "path"),
    ("n", "requests"),
    ("wall s", "wall_s"),
    ("latency p50 s", "latency_p50_s"),
    ("RTF", "rtf_mean"),
    ("audio-s/s", "audio_s_per_s"),
    ("out tok/s", "output_tokens_per_s"),
    ("TTFT p50 s", "ttft_p50_s"),
    ("vs direct", "latency_ratio_vs_direct"),
    ("peak KV %", "peak_kv_usage"),
    ("GPU mem GiB", "peak_gpu_used_bytes"),
)


def _cells(row: dict[str, Any]) -> list[str]:
    out = []
    for _, key in COLUMNS:
        value = row.get(key)
        if key == "latency_ratio_vs_direct":
            out.append(_pct(value))
        elif key == "peak_kv_usage":
            out.append("-" if value is None else f"{value * 100:.1f}")
        elif key == "peak_gpu_used_bytes":
            out.append(_gib(value if value is not None else row.get("peak_torch_allocated_bytes")))
        elif key == "path" and row.get("stream"):
            out.append(f"{value} (SSE)")
        elif key == "rtf_mean":
            out.append("-" if value is None else f"{value:.4f}")
        else:
            out.append(_f(value))
    return out


def benchmark_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One result file's benchmark rows (those with a `cell`); other tools' files under bench/results/ hold rows of their own."""
    return [row for row in result.get("rows", []) if "cell" in row]


def rows_of(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every benchmark row of `results`."""
    return [row for result in results for row in benchmark_rows(result)]


def text_table(results: list[dict[str, Any]]) -> str:
    rows = [_cells(r) for r in rows_of(results)]
    header = [name for name, _ in COLUMNS]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
    return "\n".join(lines)


def markdown_table(results: list[dict[str, Any]]) -> str:
    header = [name for name, _ in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for row in rows_of(results):
        lines.append("| " + " | ".join(_cells(row)) + " |")
    return "\n".join(lines)


def comparisons(results: list[dict[str, Any]]) -> list[str]:
    """Lines comparing with bench-host.md's plain-script figures and the program's bound."""
    out = []
    rows = rows_of(results)
    for row in rows:
        base = BASELINES.get(row["cell"])
        if not base or row["path"] not in ("direct", "transformers", "gateway") or row.get("stream"):
            continue
        parts = []
        if "latency_s" in base and row.get("latency_mean_s"):
            parts.append(
                f"latency {row['latency_mean_s']:.3f} s vs the plain-script {base['latency_s']} s "
                f"(speed ratio {base['latency_s'] / row['latency_mean_s']:.2f})"
            )
        if "audio_s_per_s" in base and row.get("audio_s_per_s"):
            parts.append(
                f"{row['audio_s_per_s']:.1f} audio-s/s vs the plain-script {base['audio_s_per_s']} "
                f"(ratio {row['audio_s_per_s'] / base['audio_s_per_s']:.2f})"
            )
        if parts:
            out.append(f"{row['cell']} [{row['path']}]: " + "; ".join(parts))
        if row["cell"].startswith("program") and row.get("latency_mean_s"):
            bound = program_bound_s(prompt_tokens=int(row.get("prompt_tokens") or 37_979))
            out.append(
                f"{row['cell']} [{row['path']}]: {row['latency_mean_s']:.1f} s is {row['latency_mean_s'] / bound:.2f}x the "
                f"bandwidth bound of {bound:.1f} s (bench-host.md's estimate: about 57 s)"
            )
    return out


def gateway_breakdowns(results: list[dict[str, Any]]) -> list[str]:
    out = []
    for row in rows_of(results):
        b = row.get("breakdown_p50_s")
        if not b or row.get("concurrency") != 1:
            continue
        out.append(
            f"{row['cell']} [gateway{' SSE' if row.get('stream') else ''}] medians: HTTP+multipart+response "
            f"{_ms(b.get('http_multipart_response'))}, job outside the engine {_ms(b.get('job_outside_engine'))}, "
            f"engine {_ms(b.get('engine'))}; vs direct {_ms_delta(row.get('overhead_ms_vs_direct'))}"
        )
    return out


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


def _ms_delta(value: Any) -> str:
    return "-" if value is None else f"{value:+.1f} ms"


def render(results: list[dict[str, Any]], *, markdown: bool = False) -> str:
    """The table of `results`; the interleaved protocol's files (kind "throughput") get its summary."""
    interleaved = [r for r in results if r.get("kind") == "throughput"]
    others = [r for r in results if r.get("kind") != "throughput"]
    parts = [render_protocol(interleaved, markdown=markdown)] if interleaved else []
    if others:
        parts.append(render_runs(others, markdown=markdown))
    return "\n\n".join(parts)


def render_protocol(results: list[dict[str, Any]], *, markdown: bool = False) -> str:
    """Per cell: median throughput per path and the median ratios with their spread, from the raw rows."""
    rows = rows_of(results)
    lines = [protocol.render(protocol.summarize_cells(rows), markdown=markdown)]
    for result in results:
        lines += [f"skipped: {note}" for note in result.get("skipped", [])]
        if result.get("error"):
            lines.append(f"error: {result['error']}")
    bad = sorted({(r["cell"], r["path"]) for r in rows if not r.get("forced_length_ok")})
    if bad:
        lines.append("output length not the forced one (or requests failed) in: " + ", ".join(f"{c}/{p}" for c, p in bad))
    return "\n".join(lines)


def render_runs(results: list[dict[str, Any]], *, markdown: bool = False) -> str:
    parts = [markdown_table(results) if markdown else text_table(results)]
    if markdown and overhead_rows(results):
        parts.append(overhead_markdown(results))
    extra = comparisons(results) + gateway_breakdowns(results)
    for result in results:
        for note in result.get("skipped", []):
            extra.append(f"skipped: {note}")
        gate = result.get("gate")
        if gate:
            extra.append(
                f"gate: qualified={gate.get('qualified')} id={gate.get('qualification_id')} "
                f"verdict={gate.get('verdict')}{' OPENED BY THE BENCH (unqualified)' if gate.get('opened_by_bench') else ''}"
            )
    if extra:
        parts.append("\n".join(("- " if markdown else "") + line for line in extra))
    return "\n\n".join(parts)


def overhead_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Gateway against direct per cell, two ways: the measured ratio (which carries the
    engine's run-to-run spread) and the gateway's own time per request (client latency minus
    the engine time the gateway's adapter measured in the same request), which does not."""
    out = []
    for result in results:
        rows = {(r["cell"], r["path"]): r for r in result.get("rows", [])}
        for (cell, path), row in rows.items():
            if path != "gateway" or row.get("stream"):
                continue
            direct = rows.get((cell, "direct"))
            records = result.get("records", {}).get(f"{cell}/gateway", [])
            own = []
            for r in records:
                server = r.get("server") or {}
                if server.get("ttft_s") is not None and server.get("decode_s") is not None:
                    own.append(r["latency_s"] - server["ttft_s"] - server["decode_s"])
            own_mean = sum(own) / len(own) if own else None
            d_lat = direct.get("latency_mean_s") if direct else None
            out.append(
                {
                    "cell": cell,
                    "concurrency": row.get("concurrency"),
                    "direct_latency_s": d_lat,
                    "gateway_latency_s": row.get("latency_mean_s"),
                    "latency_ratio": row.get("latency_ratio_vs_direct"),
                    "throughput_ratio": row.get("throughput_ratio_vs_direct"),
                    "gateway_own_ms": None if own_mean is None else own_mean * 1000.0,
                    "gateway_own_share": own_mean / d_lat if own_mean is not None and d_lat else None,
                }
            )
    return out


def overhead_markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| cell | concurrency | direct latency s | gateway latency s | measured latency ratio | throughput ratio "
        "| gateway's own time per request | own time / direct latency |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in overhead_rows(results):
        own = "-" if o["gateway_own_ms"] is None else f"{o['gateway_own_ms']:.1f} ms"
        share = "-" if o["gateway_own_share"] is None else f"{o['gateway_own_share'] * 100:.1f} %"
        lines.append(
            f"| {o['cell']} | {o['concurrency']} | {_f(o['direct_latency_s'])} | {_f(o['gateway_latency_s'])} | "
            f"{_pct(o['latency_ratio'])} | {_pct(o['throughput_ratio'])} | {own} | {share} |"
        )
    return "\n".join(lines)
