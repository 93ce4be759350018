"""The evaluator end to end against a fake gateway (httpx MockTransport): tracks kept apart,
the hand-computed scores, failures recorded, the server's track checked, report, plots and compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf

from service.cli import main
from service.evaluation import plots, report
from service.evaluation.client import GatewayClient
from service.evaluation.errors import EvaluationError
from service.evaluation.gold import Turn, write_seglst
from service.evaluation.manifest import read_manifest
from service.evaluation.protocol import Protocol
from service.evaluation.runner import run

GOLD = [Turn(0.5, 1.5, "A", "good morning"), Turn(2.5, 3.5, "B", "the pipeline is ready")]
RIGHT = [{"start": 0.5, "end": 1.5, "speaker": "S01", "text": "Good morning."},
         {"start": 2.5, "end": 3.5, "speaker": "S02", "text": "The pipeline is ready."}]
ONE_SPEAKER = [{**RIGHT[0], "speaker": "S01"}, {**RIGHT[1], "speaker": "S01"}]


def fake_gateway(served_track: dict[str, str] | None = None) -> httpx.MockTransport:
    """Native: the right transcript; chunked: right words, all under one speaker; 'long.wav' is refused natively."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = request.content
        track = "chunked" if b"server_vad" in body else "native"
        headers = {"X-Moss-Backend-Fingerprint": "fp-test", "X-Moss-Qualification-Id": "q-test",
                   "X-Moss-Track": (served_track or {}).get(track, track), "X-Moss-Stop": "eos",
                   "X-Moss-Truncated": "false", "X-Moss-Coverage": "0.9", "X-Request-Id": "r1"}
        if b'filename="long.wav"' in body and track == "native":
            return httpx.Response(400, headers=headers, json={"error": {"code": "audio_too_long", "message": "too long"}})
        segments = RIGHT if track == "native" else ONE_SPEAKER
        return httpx.Response(200, headers=headers, json={"text": "", "segments": segments, "duration": 4.0, "moss": {}})

    return httpx.MockTransport(handle)


@pytest.fixture()
def manifest(tmp_path: Path) -> Path:
    sf.write(tmp_path / "clip.wav", np.zeros(4 * 16000, dtype=np.float32), 16000)
    sf.write(tmp_path / "long.wav", np.zeros(4 * 16000, dtype=np.float32), 16000)
    write_seglst(tmp_path / "clip.json", "clip", GOLD)
    lines = [{"id": "clip", "audio": "clip.wav", "gold": "clip.json"},
             {"id": "long", "audio": "long.wav", "gold": "clip.json"}]
    path = tmp_path / "manifest.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def evaluate(manifest: Path, transport: httpx.MockTransport) -> dict[str, Any]:
    protocol = Protocol(bootstrap_samples=200)
    with GatewayClient("http://fake", transport=transport) as client:
        result = run(read_manifest(manifest), ("native", "chunked"), client, protocol)
    return report.build(result, protocol, url="http://fake", manifest=manifest, tracks=("native", "chunked"))


def test_tracks_are_scored_apart_with_hand_computed_numbers(manifest: Path) -> None:
    built = evaluate(manifest, fake_gateway())
    native, chunked = built["tracks"]["native"], built["tracks"]["chunked"]
    clip = next(i for i in native["items"] if i["id"] == "clip")
    assert all(clip[m] == 0 for m in ("cer", "wer", "cpcer", "cpwer", "der", "jer"))
    assert clip["backend"] == {"fingerprint": "fp-test", "qualification_id": "q-test"} and clip["track"] == "native"
    refused = next(i for i in native["items"] if i["id"] == "long")
    assert refused["status"] == "failed" and refused["error"]["code"] == "audio_too_long" and refused["cer"] is None
    assert native["overall"]["failed"] == 1 and native["overall"]["failures"] == {"audio_too_long": 1}
    assert native["overall"]["cer"] == 0 and native["overall"]["success"] == 0.5
    # chunked: right words under one speaker. WER 0; cpWER: B->X costs 2 insertions + A's 2 deletions = 4 of 6 words.
    # DER (collar 0.25): scored 0.75-1.25 and 2.75-3.25 s, one of them confused: 0.5 / 1.0.
    # JER: each gold speaker has Jaccard 0.5 with X; one mapped (0.5), one unmapped (1): 1.5 / 2.
    item = chunked["items"][0]
    assert item["wer"] == 0 and item["cpwer"] == pytest.approx(4 / 6)
    assert item["der"] == pytest.approx(0.5) and item["jer"] == pytest.approx(0.75)
    assert item["speaker_count_error"] == -1
    assert chunked["overall"]["cpwer"] == pytest.approx(8 / 12)  # both items pooled: 8 errors over 12 words
    assert chunked["overall"]["stops"] == {"eos": 2}
    assert chunked["backend"] == {"fingerprints": ["fp-test"], "qualification_ids": ["q-test"], "mixed": False}


def test_a_server_answering_another_track_is_refused(manifest: Path) -> None:
    with pytest.raises(EvaluationError, match="asked for the chunked track"):
        evaluate(manifest, fake_gateway(served_track={"chunked": "native"}))


def test_report_markdown_plots_and_compare(manifest: Path, tmp_path: Path) -> None:
    built = evaluate(manifest, fake_gateway())
    json_path, md_path = report.write(built, tmp_path / "out")
    written = plots.write_plots(built, tmp_path / "out")
    assert {p.name for p in written} == {f"{k}_{t}.png" for k in ("cer", "coverage", "drift") for t in ("native", "chunked")}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
    text = md_path.read_text()
    assert "## Track: native" in text and "## Track: chunked" in text and "fp-test" in text
    # every table row has as many cells as its header (no stray "|" inside a cell)
    for table in [block for block in text.split("\n\n") if block.startswith("| ")]:
        assert len({row.count("|") for row in table.splitlines()}) == 1, table
    assert report.load(json_path)["tracks"]["native"]["overall"]["der"] == 0
    # native against chunked on the one item both scored: cpWER 0 vs 4/6
    out = tmp_path / "cmp"
    assert main(["evaluate", "--compare", str(json_path), str(json_path), "--tracks", "native:chunked", "--out", str(out)]) == 0
    (result,) = json.loads((out / "compare.json").read_text())
    assert result["paired_items"] == ["clip"] and result["only_in_b"] == ["long"]
    assert result["metrics"]["cpwer"]["difference"] == pytest.approx(-4 / 6)
    assert result["metrics"]["cer"]["difference"] == 0 and result["metrics"]["cer"]["significant"] is False
    assert main(["evaluate", "--compare", str(json_path), str(json_path), "--tracks", "native:fast", "--out", str(out)]) == 2


def test_requests_carry_the_api_key_the_format_and_the_track_choice(manifest: Path) -> None:
    seen: list[httpx.Request] = []
    inner = fake_gateway()

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return inner.handle_request(request)

    with GatewayClient("http://fake", api_key="k1", transport=httpx.MockTransport(record)) as client:
        client.transcribe("clip.wav", b"RIFF", "native")
        client.transcribe("clip.wav", b"RIFF", "chunked")
    assert all(r.headers["authorization"] == "Bearer k1" for r in seen)
    native, chunked = (r.content for r in seen)
    assert b"diarized_json" in native and b"chunking_strategy" not in native
    assert b'{"type": "server_vad"}' in chunked


def test_cli_exits_2_on_a_bad_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.jsonl").write_text('{"id": "a"}\n')
    assert main(["evaluate", str(tmp_path / "m.jsonl"), "--out", str(tmp_path / "out")]) == 2
    assert "missing audio, gold" in capsys.readouterr().err
    assert main(["evaluate", "--out", str(tmp_path / "out")]) == 2


def test_windows_are_cut_at_the_frozen_points_and_recorded(manifest: Path) -> None:
    lines = [{"id": "prog", "audio": "clip.wav", "gold": "clip.json", "scope": "windows", "cuts": [0, 2, 4],
              "tracks": ["chunked"]}]
    windowed = manifest.with_name("windows.jsonl")
    windowed.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    built = evaluate(windowed, fake_gateway())
    assert list(built["tracks"]) == ["chunked"]
    units = built["tracks"]["chunked"]["items"]
    assert [u["id"] for u in units] == ["prog@0-2s", "prog@2-4s"]
    assert [u["window"] for u in units] == [{"start_s": 0.0, "end_s": 2.0, "crossing_turns": 0},
                                            {"start_s": 2.0, "end_s": 4.0, "crossing_turns": 0}]
    assert [u["audio_s"] for u in units] == [2.0, 2.0]
    assert built["cuts"]["prog"]["cuts"] == [0.0, 2.0, 4.0] and built["cuts"]["prog"]["frozen"] is True
    # window 0-2 s holds gold "good morning" (2 words); the fake answers both segments: 4 insertions -> WER 2
    assert units[0]["wer"] == pytest.approx(2.0)
