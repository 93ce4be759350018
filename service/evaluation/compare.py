"""Two reports side by side: the differences, and whether they are significant.

Either two reports of the same track (two backends, two releases) or two tracks
of one or two reports (native against chunked): each side is a (report, track)
pair. Items are paired by id and only items scored on both sides enter the test
(a paired bootstrap, `stats.Bootstrap.paired`, with the first report's seed), so
the compared figures can differ from each report's own `overall`, which is why
both are printed. A difference is "significant" when its interval excludes 0.
"""

from __future__ import annotations

from typing import Any

from service.evaluation.errors import EvaluationError
from service.evaluation.report import POOLED_METRICS, ratios
from service.evaluation.stats import Bootstrap

SCHEMA = "moss-gateway-comparison/1"


def _side(report: dict[str, Any], track: str, name: str) -> dict[str, Any]:
    section: dict[str, Any] | None = report["tracks"].get(track)
    if section is None:
        raise EvaluationError(f"{name} has no {track} track (it has {sorted(report['tracks'])})")
    return section


def compare(a: dict[str, Any], b: dict[str, Any], track_a: str, track_b: str) -> dict[str, Any]:
    side_a, side_b = _side(a, track_a, "report A"), _side(b, track_b, "report B")
    items_a = {i["id"]: i for i in side_a["items"] if i["status"] == "ok"}
    items_b = {i["id"]: i for i in side_b["items"] if i["status"] == "ok"}
    common = sorted(set(items_a) & set(items_b))
    protocol = a["protocol"]
    if (a["protocol"]["collar_s"], a["protocol"]["normalisation"]) != (b["protocol"]["collar_s"], b["protocol"]["normalisation"]):
        raise EvaluationError("the reports were scored with different collars or normalisations; they cannot be compared")
    boot = Bootstrap(samples=protocol["bootstrap_samples"], seed=protocol["seed"], confidence=protocol["confidence"])
    rows: dict[str, Any] = {}
    for metric in POOLED_METRICS:
        paired = [i for i in common if metric in (items_a[i].get("counts") or {}) and metric in (items_b[i].get("counts") or {})]
        rows[metric] = boot.paired(ratios([items_a[i] for i in paired], metric), ratios([items_b[i] for i in paired], metric))
    return {
        "schema": SCHEMA,
        "a": {"track": track_a, "backend": side_a["backend"], "overall": {m: side_a["overall"][m] for m in POOLED_METRICS},
              "created_utc": a["created_utc"]},
        "b": {"track": track_b, "backend": side_b["backend"], "overall": {m: side_b["overall"][m] for m in POOLED_METRICS},
              "created_utc": b["created_utc"]},
        "paired_items": common,
        "only_in_a": sorted(set(items_a) - set(items_b)),
        "only_in_b": sorted(set(items_b) - set(items_a)),
        "metrics": rows,
    }


def _num(value: Any) -> str:
    return "–" if value is None else f"{value:.4f}"


def markdown(result: dict[str, Any]) -> str:
    a, b = result["a"], result["b"]
    lines = [
        "# Comparison",
        "",
        f"A: track `{a['track']}`, backend {', '.join(a['backend']['fingerprints']) or '–'} ({a['created_utc']})",
        f"B: track `{b['track']}`, backend {', '.join(b['backend']['fingerprints']) or '–'} ({b['created_utc']})",
        "",
        f"{len(result['paired_items'])} items scored on both sides; only in A: {result['only_in_a'] or 'none'}; "
        f"only in B: {result['only_in_b'] or 'none'}. Values are fractions on the paired items; "
        "difference is A − B (lower is better for every error rate; higher for tail coverage).",
        "",
        "| metric | A | B | A − B | interval | p | significant |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for metric, row in result["metrics"].items():
        interval = "–" if row["ci_low"] is None else f"[{row['ci_low']:.4f}, {row['ci_high']:.4f}]"
        lines.append(
            f"| {metric} | {_num(row['a'])} | {_num(row['b'])} | {_num(row['difference'])} | {interval} | "
            f"{_num(row['p_value'])} | {'yes' if row['significant'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"
