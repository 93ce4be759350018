"""The interleaved measurement protocol (issue 13): rows, medians, ratios and their spread.

Single runs of a cell on the bench host differ by up to 25 % (bench-host.md), so
one run cannot tell a 3 % loss from noise. The protocol therefore measures every
path of a cell in each *repetition*, rotates the order of the paths from one
repetition to the next (so no path always runs first, on a cold or a warm
engine), repeats at least three times, and compares paths *within* a
repetition: the ratio gateway/direct of repetition r uses the two blocks of
repetition r, which ran seconds apart on the same engine. The report gives per
cell the median throughput of each path and the median of the per-repetition
ratios with their spread (min-max and the interquartile range).

Pure functions only: the runner is `bench.throughput`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

#: The paths of the protocol. `direct`: the gateway's own engine object called in-process with
#: the engine request the gateway builds for an unstreamed request (final-only output);
#: `gateway`: the real gateway over HTTP on loopback; `vllm-serve`: vLLM's own OpenAI server
#: (a separate process on the same engine settings), its transcription endpoint.
PATHS = ("direct", "gateway", "vllm-serve")
#: The gateway as deployed with several front-end processes on its own engine (bench/gateway_mp.py).
MULTIPROCESS_PATH = "gateway-mp"
#: `direct` as one more client of gateway-mp's own engine core: gateway-mp's same-engine reference.
MULTIPROCESS_DIRECT_PATH = "direct-mp"
#: Diagnostic paths (`--paths` may name them; not part of the ratios): `direct-top5` is `direct` asking
#: for the top-5 log-probabilities of every token, `gateway-verbose` the gateway asked for
#: `verbose_json` -- the pair the benchmark compared before this protocol (see docs/benchmarks.md).
EXTRA_PATHS = ("direct-top5", "gateway-verbose", MULTIPROCESS_PATH, MULTIPROCESS_DIRECT_PATH)
MIN_REPEATS = 3

#: The ratios the report gives: (name, numerator path, denominator path).
RATIOS = (
    ("gateway/direct", "gateway", "direct"),
    ("gateway/vllm-serve", "gateway", "vllm-serve"),
    ("vllm-serve/direct", "vllm-serve", "direct"),
    ("gateway-mp/direct", MULTIPROCESS_PATH, "direct"),
    ("gateway-mp/vllm-serve", MULTIPROCESS_PATH, "vllm-serve"),
    ("gateway-mp/direct-mp", MULTIPROCESS_PATH, MULTIPROCESS_DIRECT_PATH),
    ("direct-mp/direct", MULTIPROCESS_DIRECT_PATH, "direct"),
)


def rotation(paths: Sequence[str], repeat: int) -> list[str]:
    """The order of the paths in repetition `repeat`: a rotation by `repeat` places.

    With as many repetitions as paths every path runs once in every position."""
    if not paths:
        return []
    k = repeat % len(paths)
    return list(paths[k:]) + list(paths[:k])


def schedule(paths: Sequence[str], repeats: int) -> list[tuple[int, int, str]]:
    """Every block of a cell in the order it runs: (repeat, position in the repeat, path)."""
    return [(r, i, p) for r in range(repeats) for i, p in enumerate(rotation(paths, r))]


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def quartiles(values: Sequence[float]) -> tuple[float, float] | None:
    """First and third quartiles, linear interpolation between order statistics (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    return _at(ordered, 0.25), _at(ordered, 0.75)


def _at(ordered: list[float], q: float) -> float:
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median, min, max, interquartile range and count of a list of per-repetition values."""
    q = quartiles(values)
    return {
        "n": len(values),
        "median": median(values),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "q1": None if q is None else q[0],
        "q3": None if q is None else q[1],
        "iqr": None if q is None else q[1] - q[0],
    }


def block_row(
    *,
    cell: Any,
    path: str,
    repeat: int,
    position: int,
    wall_s: float,
    records: list[dict[str, Any]],
    generated_tokens: int | None = None,
    cpu_s: float | None = None,
    loop_cpu_s: float | None = None,
) -> dict[str, Any]:
    """One measured block (one path, one repetition of a cell) as a raw row.

    `generated_tokens` overrides the per-request counts (vllm serve reports none per
    request: the runner reads the delta of its `vllm:generation_tokens_total`)."""
    ok = [r for r in records if r.get("status", 200) == 200 and not r.get("error")]
    counted = [r.get("generated_tokens") for r in ok]
    tokens = generated_tokens
    if tokens is None and ok and all(c is not None for c in counted):
        tokens = sum(int(c) for c in counted)  # type: ignore[arg-type]
    audio_s = cell.duration_s * len(ok)
    latencies = [float(r["latency_s"]) for r in ok if r.get("latency_s") is not None]
    expected = cell.output_tokens * len(ok)
    own = [_own_time(r) for r in ok] if path == "gateway" else []
    own = [o for o in own if o is not None]
    return {
        "cell": cell.name,
        "workload": cell.workload,
        "path": path,
        "repeat": repeat,
        "position": position,
        "concurrency": cell.concurrency,
        "duration_s": cell.duration_s,
        "output_tokens": cell.output_tokens,
        "requests": len(records),
        "ok": len(ok),
        "wall_s": wall_s,
        "audio_s": audio_s,
        "generated_tokens": tokens,
        "forced_length_ok": bool(ok) and len(ok) == len(records) and tokens == expected,
        "audio_s_per_s": audio_s / wall_s if wall_s > 0 else None,
        "output_tokens_per_s": (tokens / wall_s) if tokens is not None and wall_s > 0 else None,
        "latency_mean_s": statistics.fmean(latencies) if latencies else None,
        "latency_p50_s": median(latencies),
        "own_time_mean_s": statistics.fmean(own) if own else None,
        # CPU of the serving process per request, all threads (direct, gateway: the harness process that
        # holds the gateway and the engine's front end; vllm-serve: its API process)
        "process_cpu_ms_per_request": None if cpu_s is None or not records else 1000.0 * cpu_s / len(records),
        # of which the event-loop thread (direct, gateway only)
        "loop_cpu_ms_per_request": None if loop_cpu_s is None or not records else 1000.0 * loop_cpu_s / len(records),
    }


def _own_time(record: dict[str, Any]) -> float | None:
    """Client latency minus the engine time the gateway measured for the same request."""
    server = record.get("server") or {}
    ttft, decode, latency = server.get("ttft_s"), server.get("decode_s"), record.get("latency_s")
    if ttft is None or decode is None or latency is None:
        return None
    return float(latency) - float(ttft) - float(decode)


def _throughput(row: dict[str, Any], *, forced: bool = False) -> float | None:
    """A block's audio-s/s when every request was answered (and, with `forced`, at the forced length)."""
    value = row.get("audio_s_per_s")
    if value is None or not row.get("ok") or row.get("ok") != row.get("requests"):
        return None
    if forced and not row.get("forced_length_ok"):
        return None
    return float(value)


def summarize_cells(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell: per path the throughput over repetitions, and the per-repetition ratios.

    A ratio of repetition r needs both paths' blocks of repetition r with every request
    answered at the forced length; any other block leaves that repetition out of that ratio
    (and says so in n). The per-path throughput keeps blocks of another length, flagged."""
    cells: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault(row["cell"], []).append(row)
    out = []
    for name, cell_rows in cells.items():
        by_path: dict[str, dict[int, dict[str, Any]]] = {}
        for row in cell_rows:
            by_path.setdefault(row["path"], {})[int(row["repeat"])] = row
        paths: dict[str, Any] = {}
        for path, reps in by_path.items():
            values = [t for t in (_throughput(r) for r in reps.values()) if t is not None]
            latencies = [float(r["latency_mean_s"]) for r in reps.values() if r.get("latency_mean_s") is not None]
            own = [float(r["own_time_mean_s"]) for r in reps.values() if r.get("own_time_mean_s") is not None]
            cpu = [
                float(r["process_cpu_ms_per_request"])
                for r in reps.values()
                if r.get("process_cpu_ms_per_request") is not None
            ]
            loop = [
                float(r["loop_cpu_ms_per_request"])
                for r in reps.values()
                if r.get("loop_cpu_ms_per_request") is not None
            ]
            paths[path] = {
                "cpu_ms_per_request": median(cpu),
                "loop_cpu_ms_per_request": median(loop),
                "audio_s_per_s": spread(values),
                "latency_mean_s": median(latencies),
                "own_time_mean_s": median(own),
                "forced_length_ok": all(bool(r.get("forced_length_ok")) for r in reps.values()),
                "repeats": sorted(reps),
            }
        ratios: dict[str, Any] = {}
        for label, num, den in RATIOS:
            if num not in by_path or den not in by_path:
                continue
            per_repeat = {}
            for repeat in sorted(set(by_path[num]) & set(by_path[den])):
                a = _throughput(by_path[num][repeat], forced=True)
                b = _throughput(by_path[den][repeat], forced=True)
                if a is not None and b:
                    per_repeat[repeat] = a / b
            ratios[label] = {**spread(list(per_repeat.values())), "per_repeat": per_repeat}
        first = cell_rows[0]
        summary: dict[str, Any] = {
            "cell": name,
            "concurrency": first.get("concurrency"),
            "duration_s": first.get("duration_s"),
            "paths": paths,
            "ratios": ratios,
        }
        # The gateway's own time per request: its mean latency minus the direct engine's, paired by
        # repetition (both ran on the same engine seconds apart); the share is of the direct latency.
        # gateway-mp's is against direct-mp, the direct client of its own engine core.
        for key, num, den in (("gateway", "gateway", "direct"), ("gateway_mp", MULTIPROCESS_PATH, MULTIPROCESS_DIRECT_PATH)):
            extra = own_time(by_path, num, den)
            if key == "gateway" or extra:
                summary[f"{key}_extra_latency_s"] = spread(extra)
            den_latency = paths.get(den, {}).get("latency_mean_s")
            if extra and den_latency:
                summary[f"{key}_extra_latency_share"] = float(median(extra) or 0.0) / den_latency
        out.append(summary)
    return out


def own_time(by_path: dict[str, dict[int, dict[str, Any]]], num: str, den: str) -> list[float]:
    """Per repetition with both blocks: `num`'s mean latency minus `den`'s (seconds)."""
    if num not in by_path or den not in by_path:
        return []
    out = []
    for repeat in sorted(set(by_path[num]) & set(by_path[den])):
        a, b = by_path[num][repeat].get("latency_mean_s"), by_path[den][repeat].get("latency_mean_s")
        if a is not None and b is not None:
            out.append(float(a) - float(b))
    return out


def _own(summary: dict[str, Any], key: str) -> str:
    share = summary.get(f"{key}_extra_latency_share")
    extra = summary.get(f"{key}_extra_latency_s") or {}
    return "-" if share is None else f"{extra['median'] * 1000:+.1f} ms = {share * 100:+.2f} %"


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def _ratio(entry: dict[str, Any] | None) -> str:
    if not entry or entry.get("median") is None:
        return "-"
    return f"{entry['median']:.3f} ({entry['min']:.3f}-{entry['max']:.3f}; IQR {entry['iqr']:.3f}; n={entry['n']})"


def render(summaries: list[dict[str, Any]], *, markdown: bool = False) -> str:
    """One line a cell: median audio-s/s per path (min-max), the median ratios with their spread.

    The gateway-mp and direct-mp paths and their ratios get columns only when some cell measured them."""
    extra = tuple(
        p for p in (MULTIPROCESS_PATH, MULTIPROCESS_DIRECT_PATH) if any(p in s["paths"] for s in summaries)
    )
    paths = (*PATHS, *extra)
    ratios = [r for r in RATIOS if r[1] in paths and r[2] in paths]
    header = [
        "cell",
        *(f"{path} audio-s/s" for path in paths),
        *(f"{label} median (min-max; IQR; n)" if n == 0 else label for n, (label, _, _) in enumerate(ratios)),
        "gateway own time per request (latency - direct's, median) / direct latency",
        *(["gateway-mp own time (latency - direct-mp's) / direct-mp latency"] if MULTIPROCESS_DIRECT_PATH in paths else []),
        f"process CPU ms/request {' / '.join(paths)}",
    ]
    lines = []
    for s in summaries:
        cols = [s["cell"]]
        for path in paths:
            entry = s["paths"].get(path)
            if entry is None:
                cols.append("-")
                continue
            t = entry["audio_s_per_s"]
            flag = "" if entry["forced_length_ok"] else " (!length)"
            cols.append(f"{_fmt(t['median'])} ({_fmt(t['min'])}-{_fmt(t['max'])}){flag}")
        for label, _, _ in ratios:
            cols.append(_ratio(s["ratios"].get(label)))
        cols.append(_own(s, "gateway"))
        if MULTIPROCESS_DIRECT_PATH in paths:
            cols.append(_own(s, "gateway_mp"))
        cols.append(" / ".join(_fmt(s["paths"].get(p, {}).get("cpu_ms_per_request")) for p in paths))
        lines.append(cols)
    if markdown:
        out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
        out += ["| " + " | ".join(c) + " |" for c in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h) for i, h in enumerate(header)]
    text = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    text += ["  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)) for c in lines]
    return "\n".join(text)


__all__ = [
    "EXTRA_PATHS",
    "MIN_REPEATS",
    "PATHS",
    "RATIOS",
    "block_row",
    "median",
    "quartiles",
    "render",
    "rotation",
    "schedule",
    "spread",
    "summarize_cells",
]
