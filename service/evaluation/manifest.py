"""The evaluation manifest: JSON Lines, one item a line.

Each line is an object with

- ``id`` (unique), ``audio`` and ``gold`` (paths relative to the manifest's folder;
  gold in SegLST ``.json``, ``.stm`` or ``.rttm``, see `gold.py`);
- ``scope`` (optional): ``"whole"`` (default) sends the item in one request and
  scores it as one unit, which for a long program is the whole-program mode
  (coverage over time and drift); ``"windows"`` cuts it into gold windows
  (`windows.py`) and scores each window as a unit;
- ``cuts`` (optional, with ``"windows"``): the frozen window boundaries in seconds,
  ``[0, 600, 1200, ...]``; without it the boundaries are every ``window_s`` seconds
  (``window_s`` on the line, else the command's ``--window-s``), and are recorded in
  the report either way;
- ``tracks`` (optional): the tracks this item runs on (``native``, ``chunked``); a
  program longer than the native limit lists only ``chunked``.

Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.evaluation.errors import EvaluationError

TRACKS = ("native", "chunked")
SCOPES = ("whole", "windows")


@dataclass(frozen=True)
class Item:
    id: str
    audio: Path
    gold: Path
    scope: str = "whole"
    cuts: tuple[float, ...] | None = None
    window_s: float | None = None
    tracks: tuple[str, ...] = TRACKS


def _item(entry: Any, base: Path, where: str) -> Item:
    if not isinstance(entry, dict):
        raise EvaluationError(f"{where}: each line must be a JSON object")
    missing = [key for key in ("id", "audio", "gold") if not entry.get(key)]
    if missing:
        raise EvaluationError(f"{where}: missing {', '.join(missing)}")
    unknown = sorted(set(entry) - {"id", "audio", "gold", "scope", "cuts", "window_s", "tracks"})
    if unknown:
        raise EvaluationError(f"{where}: unknown field {unknown[0]!r}")
    scope = entry.get("scope", "whole")
    if scope not in SCOPES:
        raise EvaluationError(f"{where}: scope must be one of {SCOPES}, got {scope!r}")
    tracks = tuple(entry.get("tracks", TRACKS))
    if not tracks or any(track not in TRACKS for track in tracks):
        raise EvaluationError(f"{where}: tracks must be a non-empty list of {TRACKS}")
    cuts = entry.get("cuts")
    if cuts is not None:
        if scope != "windows":
            raise EvaluationError(f"{where}: cuts need scope 'windows'")
        if not isinstance(cuts, list) or len(cuts) < 2 or any(not isinstance(c, int | float) for c in cuts):
            raise EvaluationError(f"{where}: cuts must be a list of at least two numbers of seconds")
        if any(b <= a for a, b in zip(cuts, cuts[1:], strict=False)) or cuts[0] < 0:
            raise EvaluationError(f"{where}: cuts must be non-negative and strictly increasing")
    window_s = entry.get("window_s")
    if window_s is not None and (not isinstance(window_s, int | float) or window_s <= 0):
        raise EvaluationError(f"{where}: window_s must be a positive number of seconds")
    return Item(
        id=str(entry["id"]),
        audio=(base / str(entry["audio"])).resolve(),
        gold=(base / str(entry["gold"])).resolve(),
        scope=scope,
        cuts=tuple(float(c) for c in cuts) if cuts is not None else None,
        window_s=float(window_s) if window_s is not None else None,
        tracks=tracks,
    )


def read_manifest(path: Path) -> list[Item]:
    """Every item of the manifest, checked; paths resolved against the manifest's folder."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EvaluationError(f"{path}: cannot read the manifest ({exc})") from None
    items: list[Item] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvaluationError(f"{where}: not JSON ({exc.msg})") from None
        item = _item(entry, path.parent, where)
        if not item.audio.is_file():
            raise EvaluationError(f"{where}: audio {item.audio} not found")
        if any(existing.id == item.id for existing in items):
            raise EvaluationError(f"{where}: duplicate id {item.id!r}")
        items.append(item)
    if not items:
        raise EvaluationError(f"{path}: the manifest has no items")
    return items
