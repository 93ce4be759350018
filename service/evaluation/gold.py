"""Reference segments, and the three gold formats the evaluator reads.

A gold file is a list of speaker turns: start and end in seconds, a speaker
label, and the words (absent in RTTM, which carries diarization only). The
format is chosen by the file's suffix:

- ``.json``: SegLST, a JSON list of ``{"session_id", "start_time", "end_time",
  "speaker", "words"}`` objects (the format meeteval and CHiME use);
- ``.stm``: NIST STM, ``file channel speaker start end [<label>] words`` a line,
  ``;;`` comments; the speakers ``inter_segment_gap`` and ``excluded_region``
  mark no-speech regions and are dropped;
- ``.rttm``: NIST RTTM ``SPEAKER file channel onset duration <NA> <NA> speaker
  <NA> <NA>`` lines; no words, so a gold read from RTTM scores only
  diarization (the text metrics of such an item are null, never 0).

The writers exist so that the synthetic gold set is written by the same code the
evaluator reads it with (a round trip the tests check).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.evaluation.errors import EvaluationError

_NO_SPEECH_SPEAKERS = frozenset({"inter_segment_gap", "excluded_region"})


@dataclass(frozen=True)
class Turn:
    """One speaker turn: who spoke from `start` to `end` (seconds) and what was said."""

    start: float
    end: float
    speaker: str
    text: str = ""

    def shifted(self, offset: float) -> Turn:
        return Turn(self.start + offset, self.end + offset, self.speaker, self.text)


@dataclass(frozen=True)
class Gold:
    """The reference of one item; `has_text` is false for diarization-only gold (RTTM)."""

    turns: tuple[Turn, ...]
    has_text: bool = True

    @property
    def speakers(self) -> list[str]:
        return sorted({turn.speaker for turn in self.turns})


def _number(value: Any, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise EvaluationError(f"{where}: {value!r} is not a number of seconds") from None
    if not math.isfinite(number) or number < 0:
        raise EvaluationError(f"{where}: {value!r} is not a non-negative number of seconds")
    return number


def _turn(start: Any, end: Any, speaker: Any, text: str, where: str) -> Turn:
    begin, finish = _number(start, where), _number(end, where)
    if finish < begin:
        raise EvaluationError(f"{where}: ends ({finish}) before it starts ({begin})")
    if not str(speaker).strip():
        raise EvaluationError(f"{where}: no speaker")
    return Turn(begin, finish, str(speaker).strip(), text.strip())


def _sorted(turns: Iterable[Turn]) -> tuple[Turn, ...]:
    return tuple(sorted(turns, key=lambda t: (t.start, t.end, t.speaker)))


def read_seglst(path: Path) -> Gold:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise EvaluationError(f"{path}: not readable SegLST JSON ({exc})") from None
    if not isinstance(data, list):
        raise EvaluationError(f"{path}: SegLST must be a JSON list of segments")
    turns = []
    for index, entry in enumerate(data):
        where = f"{path}[{index}]"
        if not isinstance(entry, dict) or not {"start_time", "end_time", "speaker"} <= set(entry):
            raise EvaluationError(f"{where}: needs start_time, end_time and speaker")
        turns.append(_turn(entry["start_time"], entry["end_time"], entry["speaker"], str(entry.get("words", "")), where))
    return Gold(_sorted(turns), has_text=True)


def read_stm(path: Path) -> Gold:
    turns = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith(";;"):
            continue
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            raise EvaluationError(f"{path}:{number}: an STM line needs file, channel, speaker, start and end")
        text = fields[5] if len(fields) > 5 else ""
        if text.startswith("<"):
            closing = text.find(">")
            text = text[closing + 1 :] if closing >= 0 else text
        if fields[2] in _NO_SPEECH_SPEAKERS:
            continue
        turns.append(_turn(fields[3], fields[4], fields[2], text, f"{path}:{number}"))
    return Gold(_sorted(turns), has_text=True)


def read_rttm(path: Path) -> Gold:
    turns = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0] != "SPEAKER":
            continue
        if len(fields) < 8:
            raise EvaluationError(f"{path}:{number}: an RTTM SPEAKER line needs at least 8 fields")
        onset = _number(fields[3], f"{path}:{number}")
        duration = _number(fields[4], f"{path}:{number}")
        turns.append(_turn(onset, onset + duration, fields[7], "", f"{path}:{number}"))
    return Gold(_sorted(turns), has_text=False)


def read_gold(path: Path) -> Gold:
    """Read a gold file, the format chosen by its suffix."""
    suffix = path.suffix.lower()
    if not path.is_file():
        raise EvaluationError(f"{path}: gold file not found")
    if suffix == ".json":
        return read_seglst(path)
    if suffix == ".stm":
        return read_stm(path)
    if suffix == ".rttm":
        return read_rttm(path)
    raise EvaluationError(f"{path}: unknown gold format {suffix!r} (use .json SegLST, .stm or .rttm)")


def write_seglst(path: Path, session_id: str, turns: Sequence[Turn]) -> None:
    entries = [
        {"session_id": session_id, "start_time": t.start, "end_time": t.end, "speaker": t.speaker, "words": t.text}
        for t in turns
    ]
    path.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def write_stm(path: Path, session_id: str, turns: Sequence[Turn]) -> None:
    lines = [f"{session_id} 1 {t.speaker} {t.start:.3f} {t.end:.3f} {t.text}".rstrip() for t in turns]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_rttm(path: Path, session_id: str, turns: Sequence[Turn]) -> None:
    lines = [
        f"SPEAKER {session_id} 1 {t.start:.3f} {t.end - t.start:.3f} <NA> <NA> {t.speaker} <NA> <NA>" for t in turns
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
