"""Every score of one item, from its gold turns and the gateway's segments.

All rates are kept as a `Ratio` (errors over a total) so that the overall figure
of a track is the pooled ratio (sum of errors over sum of totals, as NIST scores a
corpus), never a mean of per-item percentages, and so that the bootstrap can
resample items (`stats.py`). Definitions, stated once here and in the report:

- CER / WER: edit distance (substitutions + deletions + insertions, via jiwer)
  between the normalised texts (`normalise.py`) of all gold turns and all
  hypothesis segments in time order, over the reference length.
- cpCER / cpWER: each speaker's turns concatenated in time order; the one-to-one
  speaker mapping with the fewest total edits is chosen (`assignment.py`); a
  speaker left unmatched on either side counts all its tokens as deletions or
  insertions. Speaker-attributed: a right word for the wrong speaker is an error.
- DER: frame-based (10 ms frames) over the reference speech time; frames within
  `collar` seconds of any reference turn boundary are not scored; overlapped
  speech is scored; miss, false alarm and speaker confusion under the one-to-one
  mapping that maximises the matched time. DER = (miss + fa + confusion) / reference speech.
- JER: per reference speaker, 1 - |ref ∩ hyp| / |ref ∪ hyp| for the mapped
  hypothesis speaker (mapping maximising the summed Jaccard index; unmapped
  reference speaker: 1), on the same scored frames; pooled over reference speakers.
- boundaries: each gold turn is paired with the hypothesis segment that overlaps
  it most in time (any speaker); start and end error are hypothesis minus gold
  seconds; unpaired gold turns are counted, not scored.
- speaker consistency (speaker stability along a program): over paired turns, the share
  labelled with the hypothesis speaker their gold speaker is most often paired with; a
  speaker split in two halfway through (a relabelling, a chunk boundary) lowers it.
- speaker count error: hypothesis speakers minus gold speakers.
- tail coverage: end of the last hypothesis segment over end of the last gold turn (at most 1).
- coverage over time: per time bin, the share of gold speech time covered by any hypothesis segment.
- drift: for each paired turn, hypothesis start minus gold start against gold start.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from service.evaluation import normalise
from service.evaluation.assignment import minimum_assignment
from service.evaluation.gold import Turn

FRAME_S = 0.01


@dataclass(frozen=True)
class Ratio:
    """A rate as errors over a total; `value` is None when the total is 0 (undefined, never 0)."""

    errors: float
    total: float

    @property
    def value(self) -> float | None:
        return self.errors / self.total if self.total > 0 else None

    def as_dict(self) -> dict[str, float | None]:
        return {"value": self.value, "errors": self.errors, "total": self.total}


def edit_errors(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Levenshtein distance between two token lists (substitutions + deletions + insertions)."""
    if not reference or not hypothesis:
        return len(reference) + len(hypothesis)
    # jiwer is the evaluation extra's (not in the serving images, whose CLI imports this package): loaded on use.
    import jiwer

    output = jiwer.process_words(" ".join(reference), " ".join(hypothesis))
    return int(output.substitutions + output.deletions + output.insertions)


def _tokens(text: str, unit: str) -> list[str]:
    return normalise.characters(text) if unit == "char" else normalise.words(text)


def _ordered_text(turns: Sequence[Turn]) -> str:
    return " ".join(turn.text for turn in sorted(turns, key=lambda t: (t.start, t.end)))


def error_rate(gold: Sequence[Turn], hypothesis: Sequence[Turn], unit: str) -> Ratio:
    """CER (`unit="char"`) or WER (`unit="word"`) over the whole item, speakers ignored."""
    reference = _tokens(_ordered_text(gold), unit)
    return Ratio(edit_errors(reference, _tokens(_ordered_text(hypothesis), unit)), len(reference))


@dataclass(frozen=True)
class SpeakerAttributed:
    ratio: Ratio
    mapping: dict[str, str | None]


def cp_error_rate(gold: Sequence[Turn], hypothesis: Sequence[Turn], unit: str) -> SpeakerAttributed:
    """cpCER / cpWER: concatenated per speaker, minimum-error speaker permutation."""
    ref_speakers = sorted({t.speaker for t in gold})
    hyp_speakers = sorted({t.speaker for t in hypothesis})
    ref = [_tokens(_ordered_text([t for t in gold if t.speaker == s]), unit) for s in ref_speakers]
    hyp = [_tokens(_ordered_text([t for t in hypothesis if t.speaker == s]), unit) for s in hyp_speakers]
    n_ref, n_hyp = len(ref), len(hyp)
    size = n_ref + n_hyp
    # Rows: reference speakers then one "nobody" row per hypothesis speaker; columns likewise.
    cost = [[0.0] * size for _ in range(size)]
    for i in range(size):
        for j in range(size):
            if i < n_ref and j < n_hyp:
                cost[i][j] = float(edit_errors(ref[i], hyp[j]))
            elif i < n_ref:
                cost[i][j] = float(len(ref[i]))
            elif j < n_hyp:
                cost[i][j] = float(len(hyp[j]))
    total, columns = minimum_assignment(cost)
    mapping = {ref_speakers[i]: (hyp_speakers[columns[i]] if columns[i] < n_hyp else None) for i in range(n_ref)}
    return SpeakerAttributed(Ratio(total, sum(len(r) for r in ref)), mapping)


@dataclass(frozen=True)
class Diarization:
    der: Ratio
    jer: Ratio
    miss_s: float
    false_alarm_s: float
    confusion_s: float
    scored_speech_s: float
    mapping: dict[str, str | None]
    collar_s: float


def _frame(seconds: float) -> int:
    return int(round(seconds / FRAME_S))


def _activity(turns: Sequence[Turn], speakers: Sequence[str], frames: int) -> np.ndarray:
    active = np.zeros((len(speakers), frames), dtype=bool)
    index = {speaker: i for i, speaker in enumerate(speakers)}
    for turn in turns:
        active[index[turn.speaker], _frame(turn.start) : _frame(turn.end)] = True
    return active


def _mapping(score: np.ndarray) -> list[int]:
    """Column of each row maximising the summed score (-1: unmapped)."""
    rows, cols = score.shape
    size = max(rows, cols)
    if size == 0:
        return []
    cost = [[-float(score[i, j]) if i < rows and j < cols else 0.0 for j in range(size)] for i in range(size)]
    _, columns = minimum_assignment(cost)
    return [columns[i] if columns[i] < cols else -1 for i in range(rows)]


def diarization(gold: Sequence[Turn], hypothesis: Sequence[Turn], collar_s: float) -> Diarization:
    """DER and JER (definitions in the module docstring)."""
    ref_speakers = sorted({t.speaker for t in gold})
    hyp_speakers = sorted({t.speaker for t in hypothesis})
    end = max([t.end for t in gold] + [t.end for t in hypothesis] + [0.0])
    frames = _frame(end + collar_s) + 1
    ref = _activity(gold, ref_speakers, frames)
    hyp = _activity(hypothesis, hyp_speakers, frames)
    scored = np.ones(frames, dtype=bool)
    if collar_s > 0:
        for turn in gold:
            for boundary in (turn.start, turn.end):
                scored[max(0, _frame(boundary - collar_s)) : _frame(boundary + collar_s)] = False
    ref, hyp = ref[:, scored], hyp[:, scored]
    overlap = (ref[:, None, :] & hyp[None, :, :]).sum(axis=2).astype(float)
    der_map = _mapping(overlap)
    n_ref, n_hyp = ref.sum(axis=0), hyp.sum(axis=0)
    correct = np.zeros(ref.shape[1], dtype=int)
    for i, j in enumerate(der_map):
        if j >= 0:
            correct += ref[i] & hyp[j]
    miss = float(np.maximum(n_ref - n_hyp, 0).sum()) * FRAME_S
    false_alarm = float(np.maximum(n_hyp - n_ref, 0).sum()) * FRAME_S
    confusion = float((np.minimum(n_ref, n_hyp) - correct).sum()) * FRAME_S
    speech = float(n_ref.sum()) * FRAME_S
    union = (ref[:, None, :] | hyp[None, :, :]).sum(axis=2).astype(float)
    jaccard = np.divide(overlap, union, out=np.zeros_like(overlap), where=union > 0)
    jer_map = _mapping(jaccard)
    jer_errors = 0.0
    for i, j in enumerate(jer_map):
        if j >= 0:
            jer_errors += 0.0 if union[i, j] == 0 else 1.0 - float(jaccard[i, j])
        else:
            jer_errors += 0.0 if not ref[i].any() else 1.0
    return Diarization(
        der=Ratio(round(miss + false_alarm + confusion, 6), round(speech, 6)),
        jer=Ratio(jer_errors, float(len(ref_speakers))),
        miss_s=round(miss, 6),
        false_alarm_s=round(false_alarm, 6),
        confusion_s=round(confusion, 6),
        scored_speech_s=round(speech, 6),
        mapping={s: (hyp_speakers[j] if j >= 0 else None) for s, j in zip(ref_speakers, der_map, strict=True)},
        collar_s=collar_s,
    )


@dataclass(frozen=True)
class Boundaries:
    start_abs: Ratio  # summed |start error| over paired turns
    end_abs: Ratio
    paired: int
    gold_turns: int
    consistency: Ratio  # paired turns under their gold speaker's dominant hypothesis speaker, over paired turns
    drift: list[tuple[float, float]] = field(default_factory=list)  # (gold start, hyp start - gold start)


def boundaries(gold: Sequence[Turn], hypothesis: Sequence[Turn]) -> Boundaries:
    """Pair each gold turn with the hypothesis segment overlapping it most; start/end errors and drift."""
    start_sum = end_sum = 0.0
    drift: list[tuple[float, float]] = []
    labels: dict[str, Counter[str]] = {}
    for turn in gold:
        best, best_overlap = None, 0.0
        for segment in hypothesis:
            shared = min(turn.end, segment.end) - max(turn.start, segment.start)
            if shared > best_overlap:
                best, best_overlap = segment, shared
        if best is None:
            continue
        start_sum += abs(best.start - turn.start)
        end_sum += abs(best.end - turn.end)
        drift.append((turn.start, round(best.start - turn.start, 6)))
        labels.setdefault(turn.speaker, Counter())[best.speaker] += 1
    paired = len(drift)
    dominant = sum(max(counts.values()) for counts in labels.values())
    return Boundaries(Ratio(round(start_sum, 6), paired), Ratio(round(end_sum, 6), paired), paired, len(gold),
                      Ratio(dominant, paired), drift)


def speaker_count_error(gold: Sequence[Turn], hypothesis: Sequence[Turn]) -> int:
    return len({t.speaker for t in hypothesis}) - len({t.speaker for t in gold})


def tail_coverage(gold: Sequence[Turn], hypothesis: Sequence[Turn]) -> float | None:
    """End of the last hypothesis segment over the end of the last gold turn, capped at 1."""
    if not gold:
        return None
    gold_end = max(t.end for t in gold)
    if gold_end <= 0:
        return None
    hyp_end = max([t.end for t in hypothesis] + [0.0])
    return min(1.0, hyp_end / gold_end)


def coverage_over_time(gold: Sequence[Turn], hypothesis: Sequence[Turn], bin_s: float) -> list[dict[str, float | None]]:
    """Per bin of `bin_s` seconds: gold speech seconds and the share of it any hypothesis segment covers."""
    if not gold:
        return []
    end = max(t.end for t in gold)
    frames = _frame(end) + 1
    speech = np.zeros(frames, dtype=bool)
    covered = np.zeros(frames, dtype=bool)
    for turn in gold:
        speech[_frame(turn.start) : _frame(turn.end)] = True
    for segment in hypothesis:
        covered[_frame(segment.start) : _frame(segment.end)] = True
    per_bin = max(1, _frame(bin_s))
    rows: list[dict[str, float | None]] = []
    for first in range(0, frames, per_bin):
        gold_frames = int(speech[first : first + per_bin].sum())
        hit = int((speech & covered)[first : first + per_bin].sum())
        rows.append(
            {
                "start_s": round(first * FRAME_S, 3),
                "gold_speech_s": round(gold_frames * FRAME_S, 3),
                "coverage": (hit / gold_frames) if gold_frames else None,
            }
        )
    return rows


def drift_slope(drift: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (hyp - gold start) against gold start, in seconds per hour of program."""
    if len(drift) < 2:
        return None
    times = np.array([t for t, _ in drift])
    offsets = np.array([d for _, d in drift])
    if float(np.ptp(times)) == 0.0:
        return None
    slope = float(np.polyfit(times, offsets, 1)[0])
    return slope * 3600 if math.isfinite(slope) else None
