"""Numbers from per-request records: wall time, RTF, throughput, TTFT, overhead."""

from __future__ import annotations

import statistics
from typing import Any

from bench.workloads import Cell


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _num(values: list[Any]) -> list[float]:
    return [float(v) for v in values if v is not None]


def summarize(cell: Cell, path: str, wall_s: float, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the table: `records` are the requests of one path of one cell."""
    ok = [r for r in records if r.get("status", 200) == 200 and not r.get("error")]
    latencies = _num([r.get("latency_s") for r in ok])
    generated = [int(r.get("generated_tokens") or 0) for r in ok]
    if path == "gateway":
        ttft_client = _num([r.get("ttft_client_s") for r in ok])
        ttft = ttft_client or _num([(r.get("server") or {}).get("ttft_s") for r in ok])
        ttft_source = "client (SSE)" if ttft_client else "gateway engine timer"
    else:
        ttft = _num([r.get("ttft_s") for r in ok])
        ttft_source = {
            "direct": "engine adapter",
            "direct-final": "engine adapter (vLLM first_token_latency)",
            "transformers": "generate streamer",
        }.get(path, "")
    audio_s = cell.duration_s * len(ok)
    tokens = sum(generated)
    per_stream = []
    for r in ok:
        first = r.get("ttft_s") if path != "gateway" else (r.get("server") or {}).get("ttft_s")
        n = int(r.get("generated_tokens") or 0)
        latency = r.get("latency_s")
        if first is not None and latency is not None and n > 1 and latency > first:
            per_stream.append((n - 1) / (latency - first))
    row: dict[str, Any] = {
        "cell": cell.name,
        "workload": cell.workload,
        "path": path,
        "stream": bool(cell.stream and path == "gateway"),
        "duration_s": cell.duration_s,
        "concurrency": cell.concurrency,
        "requests": len(records),
        "ok": len(ok),
        "output_tokens": cell.output_tokens,
        "forced_length_ok": bool(ok) and all(g == cell.output_tokens for g in generated),
        "prompt_tokens": next((r.get("prompt_tokens") for r in ok if r.get("prompt_tokens")), None),
        "wall_s": wall_s,
        "audio_s_per_s": audio_s / wall_s if wall_s > 0 else None,
        "output_tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "latency_mean_s": _mean(latencies),
        "latency_p50_s": _percentile(latencies, 0.5),
        "latency_p90_s": _percentile(latencies, 0.9),
        "rtf_mean": (_mean(latencies) or 0.0) / cell.duration_s if latencies else None,
        "ttft_p50_s": _percentile(ttft, 0.5),
        "ttft_mean_s": _mean(ttft),
        "ttft_source": ttft_source,
        "decode_tokens_per_s_per_stream_p50": _percentile(per_stream, 0.5),
    }
    if path == "gateway" and ok:
        row["breakdown_p50_s"] = gateway_breakdown(ok)
    return row


def gateway_breakdown(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Where a gateway request's time goes (medians): HTTP + multipart + response outside the
    job, the job outside the engine (decode, budget, parse, account), and the engine itself."""
    http, job_extra, engine = [], [], []
    for r in records:
        server = r.get("server") or {}
        total, ttft, decode = server.get("total_s"), server.get("ttft_s"), server.get("decode_s")
        if total is None or r.get("latency_s") is None:
            continue
        http.append(r["latency_s"] - total)
        if ttft is not None and decode is not None:
            engine.append(ttft + decode)
            job_extra.append(total - ttft - decode)
    return {
        "http_multipart_response": _percentile(http, 0.5),
        "job_outside_engine": _percentile(job_extra, 0.5),
        "engine": _percentile(engine, 0.5),
    }


def add_overheads(rows: list[dict[str, Any]]) -> None:
    """Gateway against direct, per cell: latency ratio and throughput ratio (in place)."""
    by_cell: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_cell.setdefault(row["cell"], {})[row["path"]] = row
    for paths in by_cell.values():
        direct = paths.get("direct")
        if direct is None:
            continue
        for name, row in paths.items():
            if name == "direct":
                continue
            lat_d, lat_g = direct.get("latency_mean_s"), row.get("latency_mean_s")
            thr_d, thr_g = direct.get("audio_s_per_s"), row.get("audio_s_per_s")
            row["latency_ratio_vs_direct"] = lat_g / lat_d if lat_d and lat_g else None
            row["throughput_ratio_vs_direct"] = thr_g / thr_d if thr_d and thr_g else None
            if lat_d and lat_g:
                row["overhead_ms_vs_direct"] = (lat_g - lat_d) * 1000.0
