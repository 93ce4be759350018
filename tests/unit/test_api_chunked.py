"""The chunked track over HTTP on the fake engine: frozen cuts, per-chunk evidence, track reported apart."""

from __future__ import annotations

import io
import json

import numpy as np
import soundfile as sf
from helpers import AppFactory, ledger_lines

LONGFORM = {"target_s": 10.0, "overlap_s": 2.0, "search_s": 3.0, "max_chunk_s": 16.0}


def speech_with_pauses(duration_s: float = 30.0, rate: int = 16_000) -> bytes:
    """Tone bursts with 1 s pauses around 10 s and 20 s, where the cuts should land."""
    t = np.arange(int(duration_s * rate)) / rate
    samples = 0.3 * np.sin(2 * np.pi * 200 * t)
    for pause in (9.5, 19.5):
        samples[int(pause * rate) : int((pause + 1.0) * rate)] = 0.0
    buffer = io.BytesIO()
    sf.write(buffer, samples.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


#: OpenAI's server_vad object: asks for the chunked track explicitly (`auto` lets the server decide).
SERVER_VAD = '{"type": "server_vad"}'


def transcribe(client, data: bytes, **fields):
    return client.post("/v1/audio/transcriptions", files={"file": ("long.wav", data, "audio/wav")}, data=fields)


def test_chunked_request_reports_cuts_chunks_and_track(fake_client: AppFactory, tmp_path) -> None:
    client, engine = fake_client(longform=LONGFORM)
    response = transcribe(client, speech_with_pauses(), chunking_strategy=SERVER_VAD, response_format="verbose_json")
    assert response.status_code == 200, response.text
    body = response.json()
    evidence = body["moss"]
    assert evidence["track"] == "chunked" and response.headers["x-moss-track"] == "chunked"
    plan = evidence["cut_plan"]
    assert response.headers["x-moss-cut-plan-sha256"] == plan["sha256"]
    cuts = plan["cuts"]
    assert len(cuts) == 3 and len(engine.requests) == 3
    assert 9.5 < cuts[1]["start_s"] + 2.0 < 10.5 and 19.5 < cuts[2]["start_s"] + 2.0 < 20.5  # cut in the pauses
    assert [c["stop"]["stop"] for c in evidence["chunks"]] == ["eos", "eos", "eos"]
    assert all(c["local_segments"][0]["speaker"] == "S01" for c in evidence["chunks"])
    starts = [s["start"] for s in body["segments"]]
    assert starts == sorted(starts) and starts[-1] > 18.0  # offsets applied
    assert evidence["speakers"]["mapping"]  # chunk-local -> global labels kept in the evidence
    assert body["usage"] == {"type": "duration", "seconds": 30.0}  # OpenAI's verbose usage kind
    assert evidence["tokens"]["generated"] == sum(c["stop"]["generated_tokens"] for c in evidence["chunks"])
    line = ledger_lines(client)[-1]
    assert line["track"] == "chunked" and line["cut_plan_sha256"] == plan["sha256"]
    assert len(line["chunks"]) == 3
    metrics = client.get("/metrics").text
    assert 'moss_gateway_stops_total{stop="eos",track="chunked"} 1.0' in metrics


def test_the_same_audio_gives_the_same_frozen_cuts(fake_client: AppFactory) -> None:
    client, _ = fake_client(longform=LONGFORM)
    data = speech_with_pauses()
    first = transcribe(client, data, chunking_strategy=SERVER_VAD, response_format="diarized_json").json()
    second = transcribe(client, data, chunking_strategy=SERVER_VAD, response_format="diarized_json").json()
    assert first["moss"]["cut_plan"] == second["moss"]["cut_plan"]


def test_sdk_style_server_vad_fields(fake_client: AppFactory) -> None:
    client, engine = fake_client(longform=LONGFORM)
    response = transcribe(
        client, speech_with_pauses(), response_format="diarized_json",
        **{"chunking_strategy[type]": "server_vad", "chunking_strategy[silence_duration_ms]": "500",
           "chunking_strategy[threshold]": "0.5", "chunking_strategy[prefix_padding_ms]": "300"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["moss"]["cut_plan"]["policy"]["min_silence_s"] == 0.5
    assert len(engine.requests) == 3


def test_over_the_native_limit_asks_for_chunking(fake_client: AppFactory) -> None:
    client, engine = fake_client(audio={"max_duration_s": 20.0}, longform=LONGFORM)
    refused = transcribe(client, speech_with_pauses())
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "audio_too_long" and "chunking_strategy" in error["message"]
    assert engine.requests == []
    auto = transcribe(client, speech_with_pauses(), chunking_strategy="auto")
    assert auto.status_code == 200 and auto.headers["x-moss-track"] == "chunked"  # auto: too long for one pass


def test_auto_runs_one_native_pass_when_the_audio_fits(fake_client: AppFactory, tmp_path) -> None:
    client, engine = fake_client(longform=LONGFORM)
    response = transcribe(client, speech_with_pauses(), chunking_strategy="auto", response_format="diarized_json")
    assert response.status_code == 200, response.text
    assert response.headers["x-moss-track"] == "native" and len(engine.requests) == 1
    line = ledger_lines(client)[-1]
    assert line["track"] == "native" and line["track_requested"] == "auto"


def test_chunked_over_its_own_limit(fake_client: AppFactory) -> None:
    client, _ = fake_client(longform={**LONGFORM, "max_duration_s": 25.0})
    refused = transcribe(client, speech_with_pauses(), chunking_strategy=SERVER_VAD)
    assert refused.status_code == 400 and "longform.max_duration_s" in refused.json()["error"]["message"]


def test_invalid_chunking_strategy_is_a_400(fake_client: AppFactory) -> None:
    client, _ = fake_client(longform=LONGFORM)
    for value in ("sometimes", '{"type": "server_vad", "threshold": 7}', '{"type": "magic"}'):
        response = transcribe(client, speech_with_pauses(), chunking_strategy=value)
        assert response.status_code == 400, value
        assert response.json()["error"]["param"] == "chunking_strategy"


def test_chunked_stream_sends_settled_segments_and_progress_in_audio_time(fake_client: AppFactory) -> None:
    client, _ = fake_client(longform=LONGFORM)
    with client.stream(
        "POST", "/v1/audio/transcriptions", files={"file": ("long.wav", speech_with_pauses(), "audio/wav")},
        data={"chunking_strategy": SERVER_VAD, "stream": "true", "response_format": "diarized_json"},
    ) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    done = events[-1]
    assert done["type"] == "transcript.text.done" and done["moss"]["track"] == "chunked"
    final = client_final_segments(client)
    streamed = [{k: e[k] for k in ("id", "start", "end", "speaker", "text")} for e in events if e["type"] == "transcript.text.segment"]
    assert streamed == final  # exactly the final segments, in order
    deltas = [e for e in events if e["type"] == "transcript.text.delta"]
    assert "".join(e["delta"] for e in deltas) == done["text"]
    assert {e["segment_id"] for e in deltas} == {s["id"] for s in final}
    progress = [e for e in events if e["type"] == "moss.progress"]
    assert len(progress) == 3  # one per finished chunk
    covered = [e["covered_s"] for e in progress]
    assert covered == sorted(covered) and all(e["duration_s"] == 30.0 for e in progress)
    assert covered[-1] == final[-1]["end"]


def client_final_segments(client) -> list[dict]:
    body = transcribe(client, speech_with_pauses(), chunking_strategy=SERVER_VAD, response_format="diarized_json").json()
    return [{k: s[k] for k in ("id", "start", "end", "speaker", "text")} for s in body["segments"]]


def test_nested_or_oversized_chunking_strategy_is_400(fake_client: AppFactory) -> None:
    """Issue 12: a chunking_strategy nested 50,000 deep was a RecursionError and a 500."""
    client, engine = fake_client(longform=LONGFORM)
    deep = '{"type": "server_vad", "threshold": ' + "[" * 50_000 + "]" * 50_000 + "}"
    nested = '{"type": "server_vad", "threshold": ' + "[" * 500 + "]" * 500 + "}"
    too_big = transcribe(client, speech_with_pauses(2.0), chunking_strategy=deep)  # over the form's text-part bound
    assert too_big.status_code == 400 and too_big.json()["error"]["code"] == "invalid_request", too_big.text[:300]
    response = transcribe(client, speech_with_pauses(2.0), chunking_strategy=nested)  # small, but nested too deep
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "chunking_strategy")
    assert engine.requests == []
