"""Gold readers, the manifest, gold windows and the synthetic gold set."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from service.evaluation import windows
from service.evaluation.errors import EvaluationError
from service.evaluation.gold import Turn, read_gold, write_rttm, write_seglst, write_stm
from service.evaluation.goldset import CONVERSATIONS, render
from service.evaluation.manifest import read_manifest

TURNS = [Turn(0.5, 1.68, "S01", "Good morning everyone."), Turn(2.6, 3.71, "S02", "The pipeline is ready.")]


def test_three_formats_round_trip(tmp_path: Path) -> None:
    write_seglst(tmp_path / "g.json", "clip", TURNS)
    write_stm(tmp_path / "g.stm", "clip", TURNS)
    write_rttm(tmp_path / "g.rttm", "clip", TURNS)
    assert read_gold(tmp_path / "g.json").turns == tuple(TURNS)
    assert read_gold(tmp_path / "g.stm").turns == tuple(TURNS)
    rttm = read_gold(tmp_path / "g.rttm")
    assert not rttm.has_text
    assert [(t.start, round(t.end, 3), t.speaker) for t in rttm.turns] == [(0.5, 1.68, "S01"), (2.6, 3.71, "S02")]


def test_stm_labels_comments_and_gaps(tmp_path: Path) -> None:
    (tmp_path / "g.stm").write_text(
        ";; a comment\n"
        "f 1 inter_segment_gap 0.0 0.5\n"
        "f 1 A 0.5 1.0 <o,f0,male> hello there\n"
        "f 1 B 1.0 2.0 你好\n"
    )
    gold = read_gold(tmp_path / "g.stm")
    assert [(t.speaker, t.text) for t in gold.turns] == [("A", "hello there"), ("B", "你好")]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("g.json", '{"not": "a list"}', "JSON list"),
        ("g.json", '[{"start_time": 2, "end_time": 1, "speaker": "A"}]', "ends"),
        ("g.stm", "f 1 A 0.5\n", "needs file"),
        ("g.txt", "", "unknown gold format"),
    ],
)
def test_bad_gold_names_the_fault(tmp_path: Path, name: str, content: str, message: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(EvaluationError, match=message):
        read_gold(tmp_path / name)


def test_manifest_resolves_paths_and_checks_fields(tmp_path: Path) -> None:
    (tmp_path / "a.wav").write_bytes(b"x")
    (tmp_path / "m.jsonl").write_text(
        "# comment\n"
        '{"id": "a", "audio": "a.wav", "gold": "a.json"}\n'
        '{"id": "b", "audio": "a.wav", "gold": "a.json", "scope": "windows", "cuts": [0, 600, 700], "tracks": ["chunked"]}\n'
    )
    first, second = read_manifest(tmp_path / "m.jsonl")
    assert first.audio == tmp_path / "a.wav" and first.scope == "whole" and first.tracks == ("native", "chunked")
    assert second.cuts == (0.0, 600.0, 700.0) and second.tracks == ("chunked",)
    for bad, message in [
        ('{"id": "a", "audio": "a.wav"}', "missing gold"),
        ('{"id": "a", "audio": "a.wav", "gold": "g", "cuts": [0, 1]}', "cuts need scope"),
        ('{"id": "a", "audio": "a.wav", "gold": "g", "scope": "windows", "cuts": [0, 5, 5]}', "strictly increasing"),
        ('{"id": "a", "audio": "a.wav", "gold": "g", "tracks": ["fast"]}', "tracks"),
        ('{"id": "a", "audio": "a.wav", "gold": "g", "colour": 1}', "unknown field"),
        ('{"id": "a", "audio": "a.wav", "gold": "g"}\n{"id": "a", "audio": "a.wav", "gold": "g"}', "duplicate id"),
        ('{"id": "a", "audio": "missing.wav", "gold": "g"}', "not found"),
    ]:
        (tmp_path / "bad.jsonl").write_text(bad + "\n")
        with pytest.raises(EvaluationError, match=message):
            read_manifest(tmp_path / "bad.jsonl")


def test_cut_points_are_recorded_and_hashed() -> None:
    assert windows.cut_points(1300.0, 600.0) == [0.0, 600.0, 1200.0, 1300.0]
    assert windows.cut_points(1300.0, 600.0, frozen=[0, 500, 1300]) == [0.0, 500.0, 1300.0]
    assert windows.cuts_sha256([0, 600.0]) == windows.cuts_sha256([0.0, 600.0])
    assert windows.cuts_sha256([0, 600]) != windows.cuts_sha256([0, 601])


def test_a_crossing_turn_splits_its_time_but_not_its_words() -> None:
    turns = [Turn(1, 3, "A", "one two"), Turn(9, 12, "B", "three four"), Turn(14, 15, "A", "five")]
    first, second = windows.windows([0.0, 10.0, 20.0])
    # B spans 9-12 s: 1 s in the first window, 2 s in the second; its midpoint 10.5 s is in the second
    in_first, crossing_first = windows.gold_in_window(turns, first)
    in_second, crossing_second = windows.gold_in_window(turns, second)
    assert in_first == [Turn(1, 3, "A", "one two"), Turn(9, 10, "B", "")]
    assert in_second == [Turn(0, 2, "B", "three four"), Turn(4, 5, "A", "five")]
    assert crossing_first == crossing_second == 1


def test_window_audio_has_the_window_samples(tmp_path: Path) -> None:
    samples = np.linspace(-0.5, 0.5, 16000 * 5, dtype=np.float32)
    sf.write(tmp_path / "p.wav", samples, 16000, subtype="PCM_16")
    chunk = windows.window_audio(tmp_path / "p.wav", windows.Window(0, 1.0, 3.5))
    data, rate = sf.read(io.BytesIO(chunk), dtype="float32")
    assert rate == 16000 and len(data) == 40000
    assert data[0] == pytest.approx(samples[16000], abs=1e-4)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="scripts/bootstrap installs espeak-ng")
def test_synthetic_conversation_gold_matches_its_audio() -> None:
    conversation = next(c for c in CONVERSATIONS if c.id == "meeting-overlap")
    mix, turns = render(conversation)
    assert len({t.speaker for t in turns}) == 3
    overlaps = [(a, b) for a, b in zip(turns, turns[1:], strict=False) if b.start < a.end]
    pauses = [b.start - a.end for a, b in zip(turns, turns[1:], strict=False) if b.start >= a.end]
    assert overlaps and max(pauses) >= 2.9
    speech = np.zeros(len(mix), dtype=bool)
    for turn in turns:
        speech[int(turn.start * 16000) : int(turn.end * 16000)] = True
        # each gold turn starts and ends with sound (trimmed utterances placed exactly)
        assert np.abs(mix[int(turn.start * 16000) : int(turn.start * 16000) + 800]).max() > 0.005
    assert np.abs(mix[~speech]).max() == 0.0  # silence outside the gold turns
    assert np.abs(mix).max() < 1.0  # overlaps do not clip
    assert json.dumps([t.text for t in turns]) == json.dumps([t.text for t in render(conversation)[1]])
