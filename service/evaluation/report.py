"""report.json and report.md: per track, `overall` and `items`.

Layout of report.json (schema `moss-gateway-evaluation/1`)::

    {"schema", "created_utc", "gateway": {"url", "backend"}, "manifest": {"path", "sha256"},
     "protocol": {normalisation rule, metric definitions, collar, frame, bootstrap, windows},
     "cuts": {item id: {"cuts": [...], "sha256", "frozen"}},
     "tracks": {"native"|"chunked": {
         "backend": {"fingerprints": [...], "qualification_ids": [...], "mixed": bool},
         "overall": {"cer", "wer", "cpcer", "cpwer", "der", "jer", ... as fractions,
                     "intervals": {metric: {"value", "ci_low", "ci_high", "errors", "total", "n"}},
                     "units", "failed", "success", "stops", "truncated", "failures", "rtf"},
         "items": [{"id", "item", "kind", "track", "audio_s", "window", "cer", ..., "counts", ...}]}}}

Every rate is a fraction (0.05 is 5 %). An item's rate is null when it is
undefined (no reference words, RTTM gold, a failed request), never 0. `overall`
pools the successful items (sum of errors over sum of totals) with a seeded
bootstrap interval; failed requests count only in `success` and `failures`.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.evaluation import metrics, normalise
from service.evaluation.errors import EvaluationError
from service.evaluation.metrics import Ratio
from service.evaluation.protocol import Protocol
from service.evaluation.runner import Run, Unit
from service.evaluation.stats import Bootstrap

SCHEMA = "moss-gateway-evaluation/1"
TEXT_METRICS = ("cer", "wer", "cpcer", "cpwer")
POOLED_METRICS = (
    *TEXT_METRICS, "der", "jer", "start_error_s", "end_error_s", "speaker_count_abs_error", "speaker_consistency",
    "tail_coverage",
)
HEADLINE = ("cer", "wer", "cpcer", "cpwer", "der", "jer")


def bootstrap_of(protocol: Protocol) -> Bootstrap:
    return Bootstrap(samples=protocol.bootstrap_samples, seed=protocol.seed, confidence=protocol.confidence)


def ratios(items: Sequence[dict[str, Any]], metric: str) -> list[Ratio]:
    """The per-item (errors, total) of `metric` over the items that have it."""
    found = []
    for item in items:
        counts = (item.get("counts") or {}).get(metric)
        if counts is not None:
            found.append(Ratio(float(counts["errors"]), float(counts["total"])))
    return found


def _item(unit: Unit) -> dict[str, Any]:
    return {"id": unit.id, "item": unit.item, "kind": unit.kind, "track": unit.track, "audio_s": unit.audio_s,
            "window": unit.window, **unit.result}


def track_section(units: Sequence[Unit], protocol: Protocol) -> dict[str, Any]:
    items = [_item(u) for u in units]
    ok = [i for i in items if i["status"] == "ok"]
    boot = bootstrap_of(protocol)
    intervals = {metric: boot.interval(ratios(ok, metric)) for metric in POOLED_METRICS}
    overall: dict[str, Any] = {metric: intervals[metric]["value"] for metric in POOLED_METRICS}
    wall = sum(i["wall_s"] for i in items)
    audio = sum(i["audio_s"] for i in items)
    overall.update(
        intervals=intervals,
        units=len(items),
        failed=len(items) - len(ok),
        success=(len(ok) / len(items)) if items else None,
        stops=dict(sorted(Counter(i.get("stop") or "none" for i in ok).items())),
        truncated=sum(1 for i in ok if i.get("truncated")),
        failures=dict(sorted(Counter(str((i.get("error") or {}).get("code")) for i in items if i["status"] != "ok").items())),
        rtf=(wall / audio) if audio > 0 else None,
        audio_s=round(audio, 3),
        wall_s=round(wall, 3),
    )
    fingerprints = sorted({i["backend"]["fingerprint"] for i in items if i["backend"]["fingerprint"]})
    qualifications = sorted({i["backend"]["qualification_id"] for i in items if i["backend"]["qualification_id"]})
    return {
        "backend": {"fingerprints": fingerprints, "qualification_ids": qualifications, "mixed": len(fingerprints) > 1},
        "overall": overall,
        "items": items,
    }


def build(run: Run, protocol: Protocol, *, url: str, manifest: Path, tracks: Sequence[str]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "created_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gateway": {"url": url, "backend": run.backend},
        "manifest": {"path": str(manifest), "sha256": hashlib.sha256(manifest.read_bytes()).hexdigest()},
        "protocol": {
            **asdict(protocol),
            "normalisation": normalise.RULE,
            "frame_s": metrics.FRAME_S,
            "definitions": metrics.__doc__,
        },
        "cuts": run.cuts,
        "tracks": {
            track: track_section([u for u in run.units if u.track == track], protocol)
            for track in tracks
            if any(u.track == track for u in run.units)
        },
    }


def _fmt(value: Any, percent: bool = True) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value * 100:.2f} %" if percent else f"{value:.3f}"
    return str(value)


def _interval(entry: dict[str, Any], percent: bool) -> str:
    if entry.get("ci_low") is None:
        return "–"
    return f"[{_fmt(entry['ci_low'], percent)}, {_fmt(entry['ci_high'], percent)}]"


_LABELS = {
    "cer": ("CER", True), "wer": ("WER", True), "cpcer": ("cpCER", True), "cpwer": ("cpWER", True),
    "der": ("DER", True), "jer": ("JER", True), "start_error_s": ("mean absolute start error (s)", False),
    "end_error_s": ("mean absolute end error (s)", False), "speaker_count_abs_error": ("mean absolute speaker count error", False),
    "speaker_consistency": ("speaker consistency", True),
    "tail_coverage": ("tail coverage", True),
}


def markdown(report: dict[str, Any]) -> str:
    protocol = report["protocol"]
    lines = [
        "# Evaluation report",
        "",
        f"Gateway `{report['gateway']['url']}`, manifest `{report['manifest']['path']}` "
        f"(sha256 `{report['manifest']['sha256'][:16]}…`), {report['created_utc']}.",
        "",
        f"Protocol: DER/JER collar {protocol['collar_s']} s, {protocol['frame_s'] * 1000:g} ms frames, overlap scored; "
        f"{protocol['confidence'] * 100:g} % bootstrap intervals over items ({protocol['bootstrap_samples']} replicates, "
        f"seed {protocol['seed']}); windows of {protocol['window_s']:g} s unless frozen cuts were given.",
        f"Normalisation (both sides): {protocol['normalisation']}.",
        "",
        "Tracks are scored apart; never add or average numbers across the sections below.",
    ]
    for track, section in report["tracks"].items():
        overall, backend = section["overall"], section["backend"]
        lines += [
            "",
            f"## Track: {track}",
            "",
            f"Backend fingerprint(s): {', '.join(f'`{f}`' for f in backend['fingerprints']) or '–'}; "
            f"qualification id(s): {', '.join(f'`{q}`' for q in backend['qualification_ids']) or '–'}"
            + (" — **more than one backend answered: these numbers mix backends**" if backend["mixed"] else ""),
            "",
            f"{overall['units']} units, {overall['failed']} failed (success {_fmt(overall['success'])}); "
            f"stops {overall['stops']}; truncated {overall['truncated']}; failures {overall['failures']}; "
            f"RTF {_fmt(overall['rtf'], percent=False)} ({overall['wall_s']} s wall for {overall['audio_s']} s audio).",
            "",
            "| metric | overall | 95 % interval | items |",
            "| --- | --- | --- | --- |",
        ]
        for metric in POOLED_METRICS:
            label, percent = _LABELS[metric]
            entry = overall["intervals"][metric]
            lines.append(f"| {label} | {_fmt(entry['value'], percent)} | {_interval(entry, percent)} | {entry['n']} |")
        lines += [
            "",
            "| unit | kind | status | CER | WER | cpCER | DER | JER | spk err | tail cov. | stop | RTF |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for item in section["items"]:
            status = item["status"] if item["status"] == "ok" else f"failed ({(item.get('error') or {}).get('code')})"
            lines.append(
                f"| {item['id']} | {item['kind']} | {status} | "
                + " | ".join(_fmt(item.get(m)) for m in ("cer", "wer", "cpcer", "der", "jer"))
                + f" | {_fmt(item.get('speaker_count_error'))} | {_fmt(item.get('tail_coverage'))} | "
                f"{item.get('stop') or '–'} | {_fmt(item.get('rtf'), percent=False)} |"
            )
    if report.get("cuts"):
        lines += ["", "## Frozen window cuts", ""]
        for item_id, cut in report["cuts"].items():
            lines.append(f"- `{item_id}`: {cut['cuts']} (sha256 `{cut['sha256'][:16]}…`, "
                         f"{'from the manifest' if cut['frozen'] else 'every window_s seconds'})")
    return "\n".join(lines) + "\n"


def write(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "report.json", out / "report.md"
    json_path.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    md_path.write_text(markdown(report), encoding="utf-8")
    return json_path, md_path


def load(path: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if report.get("schema") != SCHEMA:
        raise EvaluationError(f"{path}: not a {SCHEMA} report")
    return report
