"""Run a manifest through a gateway and score every unit, track by track.

A unit is what one request transcribes: a whole item, or one gold window of it.
Each track is run and scored on its own (`track` is on every unit and the
report keeps one section per track), so native and chunked numbers never mix.
Requests go one at a time so that each one's wall time is its own (RTF).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from service.evaluation import metrics, windows
from service.evaluation.client import GatewayClient, Transcription
from service.evaluation.errors import EvaluationError
from service.evaluation.gold import Gold, Turn, read_gold
from service.evaluation.manifest import Item
from service.evaluation.protocol import Protocol

logger = logging.getLogger(__name__)


@dataclass
class Unit:
    """One scored request: which item/window, on which track, and every score."""

    id: str
    item: str
    kind: str
    track: str
    audio_s: float
    window: dict[str, float | int] | None
    result: dict[str, Any] = field(default_factory=dict)


def _value(ratio: metrics.Ratio) -> float | None:
    value = ratio.value
    return None if value is None else round(value, 6)


def score(gold: Gold, gold_turns: Sequence[Turn], transcription: Transcription, audio_s: float,
          protocol: Protocol) -> dict[str, Any]:
    """Every metric of one unit (definitions in `metrics.py`), tagged with the backend that produced it."""
    hyp = list(transcription.segments)
    base: dict[str, Any] = {
        "status": "ok" if transcription.ok else "failed",
        "http_status": transcription.status,
        "backend": {"fingerprint": transcription.fingerprint, "qualification_id": transcription.qualification_id},
        "request_id": transcription.request_id,
        "wall_s": transcription.wall_s,
        "rtf": round(transcription.wall_s / audio_s, 6) if audio_s > 0 else None,
    }
    if not transcription.ok:
        base["error"] = transcription.error
        base.update({name: None for name in ("cer", "wer", "cpcer", "cpwer", "der", "jer")})
        return base
    counts: dict[str, dict[str, float | None]] = {}
    for name, ratio in _text_ratios(gold, gold_turns, hyp).items():
        base[name] = _value(ratio) if ratio is not None else None
        if ratio is not None:
            counts[name] = ratio.as_dict()
    dia = metrics.diarization(gold_turns, hyp, protocol.collar_s)
    bounds = metrics.boundaries(gold_turns, hyp)
    tail = metrics.tail_coverage(gold_turns, hyp)
    speaker_error = metrics.speaker_count_error(gold_turns, hyp)
    base.update(
        der=_value(dia.der),
        jer=_value(dia.jer),
        diarization={
            "collar_s": dia.collar_s, "miss_s": dia.miss_s, "false_alarm_s": dia.false_alarm_s,
            "confusion_s": dia.confusion_s, "scored_speech_s": dia.scored_speech_s, "mapping": dia.mapping,
        },
        start_error_s=_value(bounds.start_abs),
        end_error_s=_value(bounds.end_abs),
        boundary_pairs=bounds.paired,
        speaker_consistency=_value(bounds.consistency),
        gold_turns=bounds.gold_turns,
        gold_speakers=len({t.speaker for t in gold_turns}),
        hyp_speakers=len({t.speaker for t in hyp}),
        speaker_count_error=speaker_error,
        tail_coverage=None if tail is None else round(tail, 6),
        server_coverage=transcription.server_coverage,
        stop=transcription.stop,
        truncated=transcription.truncated,
        cut_plan_sha256=transcription.cut_plan_sha256 or None,
        coverage_over_time=metrics.coverage_over_time(gold_turns, hyp, protocol.bin_s),
        drift=[[t, d] for t, d in bounds.drift],
        drift_s_per_hour=metrics.drift_slope(bounds.drift),
    )
    counts["der"] = dia.der.as_dict()
    counts["jer"] = dia.jer.as_dict()
    counts["start_error_s"] = bounds.start_abs.as_dict()
    counts["end_error_s"] = bounds.end_abs.as_dict()
    counts["speaker_consistency"] = bounds.consistency.as_dict()
    counts["speaker_count_abs_error"] = metrics.Ratio(abs(speaker_error), 1).as_dict()
    if tail is not None:
        counts["tail_coverage"] = metrics.Ratio(tail, 1).as_dict()
    base["counts"] = counts
    return base


def _text_ratios(gold: Gold, gold_turns: Sequence[Turn], hyp: Sequence[Turn]) -> dict[str, metrics.Ratio | None]:
    if not gold.has_text:
        return {"cer": None, "wer": None, "cpcer": None, "cpwer": None}
    return {
        "cer": metrics.error_rate(gold_turns, hyp, "char"),
        "wer": metrics.error_rate(gold_turns, hyp, "word"),
        "cpcer": metrics.cp_error_rate(gold_turns, hyp, "char").ratio,
        "cpwer": metrics.cp_error_rate(gold_turns, hyp, "word").ratio,
    }


@dataclass
class Run:
    units: list[Unit]
    cuts: dict[str, dict[str, Any]]
    backend: dict[str, Any]


def run(items: Sequence[Item], tracks: Sequence[str], client: GatewayClient, protocol: Protocol,
        progress: Callable[[str], None] = logger.info) -> Run:
    """Send every unit of every item on every asked track that the item allows, and score it."""
    units: list[Unit] = []
    cuts: dict[str, dict[str, Any]] = {}
    for item in items:
        gold = read_gold(item.gold)
        duration = windows.audio_duration(item.audio)
        plan: list[tuple[str, str, float, dict[str, float | int] | None, list[Turn], Callable[[], bytes]]] = []
        if item.scope == "windows":
            if duration is None:
                raise EvaluationError(f"{item.id}: {item.audio} cannot be cut into windows (libsndfile cannot read it)")
            points = windows.cut_points(duration, item.window_s or protocol.window_s, item.cuts)
            cuts[item.id] = {"cuts": points, "sha256": windows.cuts_sha256(points), "frozen": item.cuts is not None}
            for window in windows.windows(points):
                window_gold, crossing = windows.gold_in_window(gold.turns, window)
                bounds = {"start_s": window.start, "end_s": window.end, "crossing_turns": crossing}
                plan.append((f"{item.id}@{window.label}", "window", window.end - window.start, bounds, window_gold,
                             partial(windows.window_audio, item.audio, window)))
        else:
            # a container libsndfile cannot read (m4a, mp4): the duration the gateway decoded is used instead
            plan.append((item.id, "whole", duration or 0.0, None, list(gold.turns), partial(Path.read_bytes, item.audio)))
        for track in tracks:
            if track not in item.tracks:
                continue
            for unit_id, kind, audio_s, span, unit_gold, audio in plan:
                progress(f"{track}: {unit_id} ({audio_s:.1f} s)")
                transcription = client.transcribe(Path(item.audio).name, audio(), track)
                seconds = audio_s or transcription.duration_s or 0.0
                unit = Unit(unit_id, item.id, kind, track, round(seconds, 3), span)
                unit.result = score(gold, unit_gold, transcription, seconds, protocol)
                units.append(unit)
    return Run(units=units, cuts=cuts, backend=client.backend())
