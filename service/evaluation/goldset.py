"""The project's own small gold set: espeak-ng conversations with known words and times.

Run ``python -m service.evaluation.goldset OUT [--native-limit-s 120]``: it writes
``OUT/audio/*.wav`` (16 kHz mono PCM-16), the gold of each conversation in all three
formats (``OUT/gold/<id>.json`` SegLST, ``.stm``, ``.rttm``, from the same turns)
and ``OUT/manifest.jsonl``. Nothing here is committed: the audio is regenerated
(deterministically for one espeak-ng build; the gold always matches the audio made
with it, because both come from the same placement).

Each conversation is a script of turns: a speaker (a distinct espeak-ng voice),
words drawn from a fixed vocabulary by a seeded generator, and the gap before the
turn (a pause, or a negative gap for an overlap with the previous turn). Each
utterance is synthesised with the qualification clip's recipe (trimmed to its
audible part), scaled so two overlapping voices cannot clip, and placed at a
whole number of milliseconds; the gold turn is exactly the placed span.

The set: ``dialogue-short`` (2 voices, about 15 s, pauses only), ``meeting-overlap``
(3 voices, about 40 s, overlaps and a long pause) and ``program-long`` (3 voices,
just over 10 minutes, scored in frozen 600 s gold windows). With
``--native-limit-s`` (the tiny checkpoint's 120 s) an item longer than the limit is
put on the chunked track only.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from qualification.clip.make_clip import synthesise
from service.evaluation.gold import Turn, write_rttm, write_seglst, write_stm

SAMPLE_RATE = 16_000
LEVEL = 0.6  # utterances peak at 0.7 * 0.6 = 0.42, so two overlapping voices stay below full scale
VOICES = {"S01": "en-us+m3", "S02": "en-us+f2", "S03": "en-gb+m4"}
VOCABULARY = (
    "report budget river window garden seven morning yellow market ticket number planet doctor "
    "orange kitchen silver winter summer music paper office engine pocket letter candle forest "
    "harbor island meeting project table camera rocket dinner travel mountain simple careful "
    "quiet early later today tomorrow green blue small large happy ready open closed"
).split()


@dataclass(frozen=True)
class Conversation:
    id: str
    speakers: tuple[str, ...]
    turns: int
    gaps: tuple[float, ...]  # cycled; seconds before each turn, negative: overlap with the previous turn
    lead_in: float = 0.5
    tail: float = 0.6
    scope: str = "whole"


CONVERSATIONS = (
    Conversation("dialogue-short", ("S01", "S02"), turns=4, gaps=(0.6, 0.9, 0.4)),
    Conversation("meeting-overlap", ("S01", "S02", "S03"), turns=10, gaps=(0.5, -0.6, 1.2, 3.0, 0.3, -0.4)),
    Conversation("program-long", ("S01", "S02", "S03"), turns=195, gaps=(0.4, 1.0, -0.5, 0.7, 2.0), scope="windows"),
)
MIN_LONG_S = 600.0


def _words(rng: random.Random) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(4, 8)))


def render(conversation: Conversation) -> tuple[np.ndarray, list[Turn]]:
    """The mixed audio and the gold turns of one conversation (deterministic for one espeak-ng)."""
    rng = random.Random(conversation.id)
    placed: list[tuple[int, np.ndarray, Turn]] = []
    cursor = round(conversation.lead_in * 1000)  # milliseconds
    previous_end = cursor
    for index in range(conversation.turns):
        speaker = conversation.speakers[index % len(conversation.speakers)]
        text = _words(rng)
        audio = synthesise(text, VOICES[speaker]) * LEVEL
        gap = conversation.gaps[index % len(conversation.gaps)] if index else 0.0
        start_ms = max(0, previous_end + round(gap * 1000)) if index else cursor
        length_ms = len(audio) * 1000 // SAMPLE_RATE
        audio = audio[: length_ms * SAMPLE_RATE // 1000]
        turn = Turn(start_ms / 1000, (start_ms + length_ms) / 1000, speaker, text)
        placed.append((start_ms * SAMPLE_RATE // 1000, audio, turn))
        previous_end = start_ms + length_ms
    total = max(first + len(audio) for first, audio, _ in placed) + round(conversation.tail * SAMPLE_RATE)
    mix = np.zeros(total, dtype=np.float64)
    for first, audio, _ in placed:
        mix[first : first + len(audio)] += audio
    return mix, [turn for _, _, turn in placed]


def write_set(out: Path, conversations: Sequence[Conversation] = CONVERSATIONS,
              native_limit_s: float | None = None) -> Path:
    """Write audio, gold (three formats) and manifest.jsonl under `out`; returns the manifest path."""
    (out / "audio").mkdir(parents=True, exist_ok=True)
    (out / "gold").mkdir(parents=True, exist_ok=True)
    lines = []
    for conversation in conversations:
        mix, turns = render(conversation)
        duration = len(mix) / SAMPLE_RATE
        if conversation.id == "program-long" and duration <= MIN_LONG_S:
            raise RuntimeError(f"program-long came out {duration:.1f} s; it must be over {MIN_LONG_S:g} s")
        sf.write(out / "audio" / f"{conversation.id}.wav", mix.astype(np.float32), SAMPLE_RATE, subtype="PCM_16")
        write_seglst(out / "gold" / f"{conversation.id}.json", conversation.id, turns)
        write_stm(out / "gold" / f"{conversation.id}.stm", conversation.id, turns)
        write_rttm(out / "gold" / f"{conversation.id}.rttm", conversation.id, turns)
        entry: dict[str, object] = {"id": conversation.id, "audio": f"audio/{conversation.id}.wav",
                                    "gold": f"gold/{conversation.id}.json", "scope": conversation.scope}
        if native_limit_s is not None and duration > native_limit_s:
            entry["tracks"] = ["chunked"]
        lines.append(json.dumps(entry))
    manifest = out / "manifest.jsonl"
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="Folder to write audio/, gold/ and manifest.jsonl into.")
    parser.add_argument("--native-limit-s", type=float, help="Put items longer than this on the chunked track only.")
    parser.add_argument("--only", nargs="*", help="Only these conversation ids.")
    args = parser.parse_args(argv)
    chosen = [c for c in CONVERSATIONS if not args.only or c.id in args.only]
    print(write_set(Path(args.out), chosen, args.native_limit_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
