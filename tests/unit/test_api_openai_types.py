"""Every body and stream event validates against openai-python's own types; the new OpenAI fields are honoured."""

from __future__ import annotations

import json
import math
import zlib

import pytest
from fake_engine import EOS, FakeEngine
from helpers import AppFactory, make_wav
from openai.types.audio import (
    Transcription,
    TranscriptionDiarized,
    TranscriptionTextDeltaEvent,
    TranscriptionTextDoneEvent,
    TranscriptionTextSegmentEvent,
    TranscriptionVerbose,
)

SCRIPT = "[0.50][S01]Good morning everyone.[1.68][2.60][S02]The pipeline is ready.[3.71]"
EVENT_TYPES = {
    "transcript.text.delta": TranscriptionTextDeltaEvent,
    "transcript.text.segment": TranscriptionTextSegmentEvent,
    "transcript.text.done": TranscriptionTextDoneEvent,
}


def post(client, **fields):
    return client.post("/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(4.0), "audio/wav")}, data=fields)


def stream(client, **fields) -> list[dict]:
    with client.stream(
        "POST", "/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(4.0), "audio/wav")},
        data={"stream": "true", **fields},
    ) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def test_json_validates_as_transcription(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    body = post(client).json()
    parsed = Transcription.model_validate(body)
    assert parsed.text == "Good morning everyone. The pipeline is ready." and parsed.logprobs is None


def test_verbose_json_validates_with_measured_segment_statistics(fake_client: AppFactory) -> None:
    client, engine = fake_client()
    body = post(client, response_format="verbose_json").json()
    verbose = TranscriptionVerbose.model_validate(body)
    assert verbose.usage is not None and verbose.usage.type == "duration" and verbose.usage.seconds == pytest.approx(4.0)
    assert verbose.segments is not None and len(verbose.segments) == 2
    first, second = verbose.segments
    # The first segment's tokens are the characters of "[0.50][S01]Good morning everyone.[1.68]".
    assert first.tokens == [ord(c) for c in "[0.50][S01]Good morning everyone.[1.68]"]
    assert second.tokens == [ord(c) for c in "[2.60][S02]The pipeline is ready.[3.71]"]
    assert first.avg_logprob == pytest.approx(math.log(0.9))  # the fake engine's sampled-token log-probability
    text = b"Good morning everyone."
    assert first.compression_ratio == pytest.approx(len(text) / len(zlib.compress(text)))
    assert first.no_speech_prob == pytest.approx(0.05)  # P(end token) where the segment starts
    assert engine.requests[0].want_logprobs == 5


def test_diarized_json_validates(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    diarized = TranscriptionDiarized.model_validate(post(client, response_format="diarized_json").json())
    assert [(s.id, s.speaker) for s in diarized.segments] == [("seg_0", "S01"), ("seg_1", "S02")]


@pytest.mark.parametrize("fmt", ["json", "text", "verbose_json", "diarized_json"])
def test_every_stream_event_validates_and_deltas_add_up(fake_client: AppFactory, fmt: str) -> None:
    client, _ = fake_client()
    events = stream(client, response_format=fmt)
    for event in events:
        if event["type"] in EVENT_TYPES:
            EVENT_TYPES[event["type"]].model_validate(event)
        else:
            assert event["type"] == "moss.progress" and 0 < event["fraction"] <= 1
    done = TranscriptionTextDoneEvent.model_validate(events[-1])
    deltas = [TranscriptionTextDeltaEvent.model_validate(e) for e in events if e["type"] == "transcript.text.delta"]
    assert "".join(d.delta for d in deltas) == done.text == "Good morning everyone. The pipeline is ready."
    assert all(d.segment_id in ("seg_0", "seg_1") for d in deltas)
    segments = [e for e in events if e["type"] == "transcript.text.segment"]
    final = post(client, response_format="diarized_json").json()["segments"]
    assert [{k: s[k] for k in ("id", "start", "end", "speaker", "text")} for s in segments] == [
        {k: s[k] for k in ("id", "start", "end", "speaker", "text")} for s in final
    ]
    progress = [e["covered_s"] for e in events if e["type"] == "moss.progress"]
    assert progress == [1.68, 3.71]  # audio covered by settled segments, not tokens over budget


def test_include_logprobs_in_json_and_stream(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    body = Transcription.model_validate(post(client, **{"include[]": "logprobs"}).json())
    assert body.logprobs is not None and len(body.logprobs) == len(SCRIPT) + 1
    assert body.logprobs[0].token == "[" and body.logprobs[0].logprob == pytest.approx(math.log(0.9))
    events = stream(client, **{"include[]": "logprobs"})
    streamed = [lp for e in events if e["type"] == "transcript.text.delta" for lp in e.get("logprobs") or []]
    done = TranscriptionTextDoneEvent.model_validate(events[-1])
    assert done.logprobs is not None and [lp.model_dump() for lp in done.logprobs] == streamed


def test_unknown_include_is_a_400(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    response = post(client, **{"include[]": "word_confidence"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "include[]"


def test_keywords_become_hotwords_and_languages_are_recorded(fake_client: AppFactory) -> None:
    client, engine = fake_client()
    response = client.post(
        "/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(4.0), "audio/wav")},
        data={"keywords[]": ["MOSS", "vLLM"], "languages[]": ["zh", "en"], "response_format": "verbose_json"},
    )
    assert response.status_code == 200, response.text
    assert "MOSS, vLLM" in engine.requests[0].instruction
    evidence = response.json()["moss"]
    assert evidence["hotwords"] == ["MOSS", "vLLM"] and evidence["languages"] == ["zh", "en"]
    assert response.json()["language"] == "zh"


@pytest.mark.parametrize("field", ["known_speaker_names[]", "known_speaker_references[]"])
def test_known_speakers_are_refused_with_the_reason(fake_client: AppFactory, field: str) -> None:
    client, engine = fake_client()
    response = post(client, **{field: "Alice"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unsupported_parameter" and "cannot" in error["message"] and engine.requests == []


def test_translations_say_the_model_transcribes_only(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    response = client.post("/v1/audio/translations", files={"file": ("a.wav", make_wav(4.0), "audio/wav")})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsupported_task" and "transcribe" in response.json()["error"]["message"]


def test_model_by_id(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    card = client.get("/v1/models/moss-transcribe-diarize-tiny")
    assert card.status_code == 200 and card.json()["id"] == "moss-transcribe-diarize-tiny"
    missing = client.get("/v1/models/whisper-1")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_rttm_lists_speaker_turns(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    lines = post(client, response_format="rttm").text.splitlines()
    assert [line.split()[3:5] + [line.split()[7]] for line in lines] == [["0.500", "1.180", "S01"], ["2.600", "1.110", "S02"]]


def test_chinese_segments_join_without_spaces(fake_client: AppFactory) -> None:
    client, _ = fake_client(FakeEngine("[0.5][S01]大家好[1.5][2.0][S02]你们好[3.0]"))
    assert post(client).json()["text"] == "大家好你们好"


def test_end_token_is_not_in_the_logprob_tokens_text(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    body = post(client, **{"include[]": "logprobs"}).json()
    assert body["logprobs"][-1]["bytes"] == [] and EOS > 0x10FFFF


def test_a_quiet_stream_sends_keepalive_comments(fake_client: AppFactory) -> None:
    client, _ = fake_client(FakeEngine(token_delay_s=0.02), limits={"sse_keepalive_s": 0.2})
    with client.stream(
        "POST", "/v1/audio/transcriptions", files={"file": ("a.wav", make_wav(4.0), "audio/wav")},
        data={"stream": "true"},
    ) as response:
        lines = list(response.iter_lines())
    assert any(line.startswith(":") for line in lines)  # SSE comments: proxies keep the connection open
    assert json.loads([line for line in lines if line.startswith("data: ")][-1][6:])["type"] == "transcript.text.done"
