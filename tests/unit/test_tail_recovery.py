"""Issue 18 on the fake engine: anomalies in every format, speech-aware truncation, and the recovery track's rules."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import numpy as np
import pytest
import soundfile as sf
from fake_engine import FakeEngine
from helpers import AppFactory, ledger_lines

from service.engine.protocol import GenerationRequest

RATE = 16_000


def wav(*parts: tuple[str, float]) -> bytes:
    """Concatenated ("tone" | "silence", seconds) parts: the tone stands for speech, silence is digital zero."""
    pieces = []
    for kind, seconds in parts:
        t = np.arange(int(seconds * RATE)) / RATE
        pieces.append(0.3 * np.sin(2 * np.pi * 220 * t) if kind == "tone" else np.zeros(t.size))
    buffer = io.BytesIO()
    sf.write(buffer, np.concatenate(pieces).astype(np.float32), RATE, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def by_length(scripts: dict[float, str], default: str = "") -> Callable[[GenerationRequest], str]:
    """A script chosen by the request's audio length (native pass vs recovery passes from a cut)."""
    def pick(request: GenerationRequest) -> str:
        seconds = round(len(request.audio) / RATE, 1)
        return scripts.get(seconds, default)
    return pick


def post(client, data: bytes, **fields: str):
    return client.post("/v1/audio/transcriptions", files={"file": ("a.wav", data, "audio/wav")}, data=fields)


def stream(client, data: bytes, **fields: str) -> tuple[str, list[dict]]:
    """The stream's track header and its events."""
    with client.stream(
        "POST", "/v1/audio/transcriptions", files={"file": ("a.wav", data, "audio/wav")}, data={"stream": "true", **fields}
    ) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
        return response.headers["x-moss-track"], events


# -- timestamps checked against the audio, the same in every format ------------------------------------------

PAST_END = "[0.50][S01]Good morning.[1.50][600.00][S02]Impossible.[602.00]"


@pytest.mark.parametrize("fmt", ["srt", "vtt", "rttm"])
def test_subtitles_never_show_a_time_past_the_end(fake_client: AppFactory, fmt: str) -> None:
    client, _ = fake_client(FakeEngine(PAST_END))
    response = post(client, wav(("tone", 4.0)), response_format=fmt)
    assert response.status_code == 200, response.text
    assert response.headers["x-moss-timestamp-anomalies"] == "1"
    body = response.text
    assert "Impossible" in body or fmt == "rttm"
    assert "10:00" not in body and "600" not in body
    if fmt == "rttm":
        starts = [float(line.split()[3]) + float(line.split()[4]) for line in body.splitlines()]
        assert max(starts) <= 4.0
    else:
        assert "00:00:04.000" in body.replace(",", ".")


def test_verbose_json_lists_the_anomaly_and_coverage_ignores_it(fake_client: AppFactory) -> None:
    client, _ = fake_client(FakeEngine(PAST_END))
    body = post(client, wav(("tone", 4.0)), response_format="verbose_json").json()
    moss = body["moss"]
    assert moss["timestamp_anomalies"] == [
        {"segment": 1, "start": 600.0, "end": 602.0, "kind": "past_end", "detail": moss["timestamp_anomalies"][0]["detail"]}
    ]
    assert [(s["start"], s["end"]) for s in body["segments"]] == [(0.5, 1.5), (4.0, 4.0)]
    assert moss["coverage"]["last_segment_end_s"] == 1.5
    assert moss["coverage"]["excluded_segments"] == [1]
    assert moss["truncated"] is True  # 2.5 s of tone after 1.5 s are uncovered speech


def test_streamed_segments_are_the_clamped_final_ones(fake_client: AppFactory) -> None:
    client, _ = fake_client(FakeEngine(PAST_END))
    _, events = stream(client, wav(("tone", 4.0)), response_format="diarized_json")
    streamed = [(e["start"], e["end"]) for e in events if e["type"] == "transcript.text.segment"]
    assert streamed == [(0.5, 1.5), (4.0, 4.0)]
    assert [a["segment"] for a in events[-1]["moss"]["timestamp_anomalies"]] == [1]


def test_the_chunked_track_renumbers_each_chunks_anomalies(fake_client: AppFactory) -> None:
    longform = {"target_s": 10.0, "overlap_s": 2.0, "search_s": 3.0, "max_chunk_s": 16.0}
    client, engine = fake_client(FakeEngine(PAST_END), longform=longform)
    data = wav(("tone", 30.0))
    body = post(client, data, response_format="diarized_json", chunking_strategy='{"type": "server_vad"}').json()
    moss = body["moss"]
    assert len(engine.requests) == 3
    anomalies = moss["timestamp_anomalies"]
    assert [a["kind"] for a in anomalies] == ["past_end"] * 3
    assert [body["segments"][a["segment"]]["text"] for a in anomalies] == ["Impossible."] * 3
    starts = [c["start_s"] for c in moss["chunks"]]
    assert [a["start"] for a in anomalies] == [round(start + 600.0, 3) for start in starts]  # global, as written
    assert all(s["end"] <= 30.0 for s in body["segments"])
    assert moss["coverage"]["excluded_segments"] == [a["segment"] for a in anomalies]
    srt = post(client, data, response_format="srt", chunking_strategy='{"type": "server_vad"}').text
    assert "00:00:30.001" not in srt and "00:10:" not in srt


# -- speech-aware truncation ------------------------------------------------------------------------------------

NATIVE_STOPS_AT_8 = "[0.00][S01]alpha beta[8.00]"


def test_a_tail_of_silence_is_not_truncated(fake_client: AppFactory) -> None:
    client, engine = fake_client(FakeEngine(NATIVE_STOPS_AT_8))
    response = post(client, wav(("tone", 8.0), ("silence", 30.0)), response_format="verbose_json", tail_recovery="auto")
    moss = response.json()["moss"]
    assert moss["coverage"]["uncovered_tail_s"] == pytest.approx(30.0, abs=0.01)
    assert moss["coverage"]["uncovered_speech_s"] < 0.05  # a frame at most straddles the end of the tone
    assert moss["truncated"] is False
    assert response.headers["x-moss-truncated"] == "false"
    assert moss["recovery"]["stopped_because"] == "not_needed" and moss["recovery"]["passes"] == []
    assert len(engine.requests) == 1


def test_a_tail_of_speech_is_truncated_and_recovery_is_off_by_default(fake_client: AppFactory) -> None:
    client, engine = fake_client(FakeEngine(NATIVE_STOPS_AT_8))
    response = post(client, wav(("tone", 20.0)), response_format="verbose_json")
    moss = response.json()["moss"]
    assert moss["track"] == "native" and "recovery" not in moss
    assert moss["stop"]["stop"] == "eos"
    assert moss["coverage"]["uncovered_tail_speech_s"] == pytest.approx(12.0, abs=0.05)
    assert moss["truncated"] is True and "12.00 s of speech" in moss["truncation_reasons"][0]
    assert response.headers["x-moss-uncovered-speech-s"] == "12.000"
    assert len(engine.requests) == 1


# -- the recovery track -----------------------------------------------------------------------------------------

RECOVERS = by_length({20.0: NATIVE_STOPS_AT_8, 13.0: "[1.50][S01]gamma delta[12.90]"})


def test_recovery_covers_the_tail_and_reports_itself(fake_client: AppFactory, tmp_path) -> None:
    client, engine = fake_client(FakeEngine(RECOVERS))
    response = post(client, wav(("tone", 20.0)), response_format="verbose_json", tail_recovery="auto")
    assert response.status_code == 200, response.text
    body = response.json()
    moss = body["moss"]
    assert [(s["start"], s["end"], s["speaker"], s["text"]) for s in body["segments"]] == [
        (0.0, 8.0, "S01", "alpha beta"),
        (8.5, 19.9, "S02", "gamma delta"),  # no overlap evidence links the passes' speakers: kept apart
    ]
    assert body["text"] == "alpha beta gamma delta"
    assert moss["track"] == "native+recovery"
    assert moss["stop"]["stop"] == "eos"  # the native pass's own stop, unchanged
    assert moss["recovery"]["native"]["truncated"] is True
    assert moss["recovery"]["native"]["coverage"]["uncovered_tail_speech_s"] == pytest.approx(12.0, abs=0.05)
    (extra,) = moss["recovery"]["passes"]
    assert (extra["cut_s"], extra["used"], extra["covered_after_s"], extra["stop"]["stop"]) == (7.0, True, 19.9, "eos")
    assert moss["recovery"]["stopped_because"] == "covered" and moss["recovery"]["recovered"] is True
    assert moss["truncated"] is False
    assert moss["tokens"]["generated"] == sum(len(s) + 1 for s in (NATIVE_STOPS_AT_8, "[1.50][S01]gamma delta[12.90]"))
    assert response.headers["x-moss-track"] == "native+recovery"
    assert response.headers["x-moss-native-truncated"] == "true"
    assert response.headers["x-moss-recovery-passes"] == "1"
    assert [round(len(r.audio) / RATE, 1) for r in engine.requests] == [20.0, 13.0]
    line = ledger_lines(client)[-1]
    assert line["track"] == "native+recovery" and line["recovery"]["passes"][0]["cut_s"] == 7.0
    metrics = client.get("/metrics").text
    assert 'moss_gateway_stops_total{stop="eos",track="native+recovery"} 1.0' in metrics


def test_recovery_stream_equals_the_final_answer(fake_client: AppFactory) -> None:
    client, _ = fake_client(FakeEngine(RECOVERS))
    track, events = stream(client, wav(("tone", 20.0)), response_format="diarized_json", tail_recovery="auto")
    assert track == "native+recovery"
    done = events[-1]
    assert done["type"] == "transcript.text.done"
    assert "".join(e["delta"] for e in events if e["type"] == "transcript.text.delta") == done["text"]
    streamed = [(e["start"], e["end"], e["speaker"]) for e in events if e["type"] == "transcript.text.segment"]
    assert streamed == [(0.0, 8.0, "S01"), (8.5, 19.9, "S02")]
    progress = [e["covered_s"] for e in events if e["type"] == "moss.progress"]
    assert progress == sorted(progress) and progress[-1] == 19.9


def test_a_pass_that_makes_no_progress_ends_the_recovery(fake_client: AppFactory) -> None:
    client, engine = fake_client(FakeEngine(by_length({20.0: NATIVE_STOPS_AT_8}, default="[0.20][S01]beta[1.00]")))
    moss = post(client, wav(("tone", 20.0)), response_format="verbose_json", tail_recovery="auto").json()["moss"]
    assert moss["recovery"]["stopped_because"] == "no_progress"
    assert [(p["used"], p["covered_after_s"]) for p in moss["recovery"]["passes"]] == [(False, 8.0)]
    assert moss["truncated"] is True and moss["coverage"]["last_segment_end_s"] == 8.0
    assert len(engine.requests) == 2


def test_recovery_stops_after_the_pass_limit(fake_client: AppFactory) -> None:
    # Every further pass covers 4 s more than where it starts.
    engine = FakeEngine(by_length({40.0: NATIVE_STOPS_AT_8}, default="[0.50][S01]more words[5.00]"))
    client, _ = fake_client(engine, coverage={"recovery_max_passes": 2})
    moss = post(client, wav(("tone", 40.0)), response_format="verbose_json", tail_recovery="auto").json()["moss"]
    passes = moss["recovery"]["passes"]
    assert moss["recovery"]["stopped_because"] == "max_passes"
    assert [(p["cut_s"], p["covered_after_s"]) for p in passes] == [(7.0, 12.0), (11.0, 16.0)]
    assert moss["truncated"] is True and moss["coverage"]["last_segment_end_s"] == 16.0


def test_tail_recovery_rejects_unknown_values(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    response = post(client, wav(("tone", 2.0)), tail_recovery="always")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tail_recovery"
