"""The HTTP contract of POST /v1/audio/transcriptions on the fake engine."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import soundfile as sf
from fake_engine import EOS, FakeEngine
from helpers import AppFactory, ledger_lines, make_wav

SCRIPT = "[0.50][S01]Good morning everyone.[1.68][2.60][S02]The pipeline is ready.[3.71]"


def post(client, data: bytes | None = None, filename: str = "clip.wav", **fields):
    files = {"file": (filename, data, "audio/wav")} if data is not None else None
    form = {name: value for name, value in fields.items()}
    return client.post("/v1/audio/transcriptions", files=files, data=form)


def test_json_format_has_text_usage_and_backend(fake_client: AppFactory) -> None:
    client, engine = fake_client()
    response = post(client, make_wav(4.0))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["text"] == "Good morning everyone. The pipeline is ready."
    assert body["usage"]["type"] == "tokens"
    assert body["usage"]["output_tokens"] == len(SCRIPT) + 1  # the script plus the end token
    assert body["usage"]["input_tokens"] == engine.count_prompt_tokens(64_000, engine.requests[0].instruction)
    assert body["backend"] == {"fingerprint": "f" * 64, "qualification_id": "q-test"}
    assert response.headers["x-moss-stop"] == "eos"
    assert response.headers["x-moss-truncated"] == "false"
    assert response.headers["x-moss-backend-fingerprint"] == "f" * 64
    assert response.headers["x-moss-qualification-id"] == "q-test"
    assert engine.requests[0].temperature == 0.0


@pytest.mark.parametrize("fmt", ["json", "text", "srt", "vtt", "rttm", "verbose_json", "diarized_json"])
def test_evidence_is_built_only_for_formats_that_carry_it(fake_client: AppFactory, monkeypatch, fmt: str) -> None:
    """The `moss` object costs CPU on the event loop: json, text and subtitles never show it, so never build it."""
    from service.transcription.accountant import Accountant

    built = []
    original = Accountant.evidence

    def counting(self, outcome, backend):  # type: ignore[no-untyped-def]
        built.append(fmt)
        return original(self, outcome, backend)

    monkeypatch.setattr(Accountant, "evidence", counting)
    client, _ = fake_client()
    response = post(client, make_wav(4.0), response_format=fmt)
    assert response.status_code == 200, response.text
    carries = fmt in ("verbose_json", "diarized_json")
    assert ('"moss"' in response.text) is carries
    assert len(built) == (1 if carries else 0)


def test_evidence_records_as_dict_match_dataclasses_asdict() -> None:
    """The shallow `as_dict` (no deep copy) must stay what `dataclasses.asdict` gives: scalar fields only."""
    import dataclasses

    from service.budget import TokenBudget
    from service.evidence import Coverage, StopRecord, UncoveredSpan

    for cls in (TokenBudget, StopRecord):
        values = {f.name: (f"v-{f.name}" if f.type in ("str", "str | None") else 1) for f in dataclasses.fields(cls)}
        record = cls(**values)
        assert record.as_dict() == dataclasses.asdict(record)
        assert list(record.as_dict()) == [f.name for f in dataclasses.fields(cls)]
    coverage = Coverage(
        audio_duration_s=40.0, last_segment_end_s=10.0, coverage=0.25, uncovered_tail_s=30.0, ends_inside_tag=False,
        incomplete_tail="", speech_s=12.0, uncovered_speech_s=2.0, uncovered_tail_speech_s=2.0,
        uncovered=(UncoveredSpan("tail", 10.0, 40.0, 2.0),), excluded_segments=(3,),
    )
    as_json = json.loads(json.dumps(coverage.as_dict()))  # the nested spans are plain data too
    assert as_json == json.loads(json.dumps(dataclasses.asdict(coverage)))
    assert list(coverage.as_dict()) == [f.name for f in dataclasses.fields(Coverage)]


def test_text_format_is_plain_text(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    response = post(client, make_wav(4.0), response_format="text")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == "Good morning everyone. The pipeline is ready."
    assert response.headers["x-moss-generated-tokens"] == str(len(SCRIPT) + 1)


def test_verbose_json_has_segments_and_evidence(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    body = post(client, make_wav(4.0), response_format="verbose_json", language="en").json()
    assert body["task"] == "transcribe"
    assert body["language"] == "en"
    assert body["duration"] == pytest.approx(4.0)
    assert [(s["id"], s["start"], s["end"], s["speaker"], s["text"]) for s in body["segments"]] == [
        (0, 0.5, 1.68, "S01", "Good morning everyone."),
        (1, 2.6, 3.71, "S02", "The pipeline is ready."),
    ]
    evidence = body["moss"]
    assert evidence["stop"]["stop"] == "eos"
    assert evidence["stop"]["end_token_id"] == EOS
    assert evidence["coverage"]["last_segment_end_s"] == pytest.approx(3.71)
    assert evidence["coverage"]["uncovered_tail_s"] == pytest.approx(0.29, abs=1e-3)
    assert evidence["truncated"] is False
    assert evidence["budget"]["source"] == "default"
    assert evidence["raw_text"] == SCRIPT
    assert evidence["language"] == "en"


def test_diarized_json_in_openai_shape(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    body = post(client, make_wav(4.0), response_format="diarized_json").json()
    assert body["task"] == "transcribe"
    assert body["segments"][0] == {
        "type": "transcript.text.segment", "id": "seg_0", "start": 0.5, "end": 1.68,
        "text": "Good morning everyone.", "speaker": "S01",
    }
    assert body["segments"][1]["speaker"] == "S02"
    assert body["usage"]["total_tokens"] == body["usage"]["input_tokens"] + body["usage"]["output_tokens"]
    assert "moss" in body


@pytest.mark.parametrize(
    ("fmt", "media", "expected"),
    [
        ("srt", "application/x-subrip", "1\n00:00:00,500 --> 00:00:01,680\n[S01] Good morning everyone."),
        ("vtt", "text/vtt", "WEBVTT"),
    ],
)
def test_subtitle_formats_carry_speakers(fake_client: AppFactory, fmt: str, media: str, expected: str) -> None:
    client, _ = fake_client()
    response = post(client, make_wav(4.0), response_format=fmt)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith(media)
    assert response.text.startswith(expected)
    assert "S02" in response.text
    assert response.headers["x-moss-stop"] == "eos"


def test_budget_below_natural_length_is_max_tokens_and_truncated(fake_client: AppFactory) -> None:
    client, engine = fake_client()
    response = post(client, make_wav(4.0), response_format="verbose_json", max_completion_tokens="44")
    body = response.json()
    assert engine.requests[0].max_tokens == 44
    assert body["moss"]["stop"]["stop"] == "max_tokens"
    assert body["moss"]["truncated"] is True
    assert body["moss"]["budget"]["source"] == "request"
    assert response.headers["x-moss-truncated"] == "true"
    assert body["segments"][0]["text"] == "Good morning everyone."
    assert len(body["segments"]) == 1
    assert body["moss"]["coverage"]["ends_inside_tag"] is True  # cut at "[2.60"
    assert body["moss"]["coverage"]["last_segment_end_s"] == pytest.approx(1.68)
    assert body["moss"]["stop"]["budget_left"] == 0


def test_max_new_tokens_alias_is_honoured(fake_client: AppFactory) -> None:
    client, engine = fake_client()
    response = post(client, make_wav(4.0), max_new_tokens="25")
    assert response.status_code == 200
    assert engine.requests[0].max_tokens == 25
    assert response.headers["x-moss-stop"] == "max_tokens"


def test_default_budget_comes_from_duration(fake_client: AppFactory) -> None:
    client, engine = fake_client()
    post(client, make_wav(10.0))
    assert engine.requests[0].max_tokens == 200  # 10 s x 20 tokens/s


def test_prompt_and_hotwords_build_the_instruction(fake_client: AppFactory) -> None:
    client, engine = fake_client()
    post(client, make_wav(2.0), prompt="Transcribe this.", hotwords="vLLM, MOSS")
    assert engine.requests[0].instruction == "Transcribe this.热词提示：vLLM, MOSS"


def test_stream_sends_deltas_segments_and_done(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    with client.stream(
        "POST", "/v1/audio/transcriptions",
        files={"file": ("a.wav", make_wav(4.0), "audio/wav")}, data={"stream": "true"},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    kinds = [event["type"] for event in events]
    assert kinds.count("transcript.text.segment") == 2
    assert kinds[-1] == "transcript.text.done"
    deltas = [e for e in events if e["type"] == "transcript.text.delta"]
    assert "".join(e["delta"] for e in deltas) == events[-1]["text"]  # clean text: no tags in the deltas
    assert {e["segment_id"] for e in deltas} == {"seg_0", "seg_1"}
    done = events[-1]
    assert done["text"] == "Good morning everyone. The pipeline is ready."
    assert done["moss"]["stop"]["stop"] == "eos"
    assert done["usage"]["output_tokens"] == len(SCRIPT) + 1
    segment = next(e for e in events if e["type"] == "transcript.text.segment")
    assert (segment["speaker"], segment["start"], segment["end"]) == ("S01", 0.5, 1.68)


def test_models_health_and_ready(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    assert client.get("/health").json() == {"status": "alive"}
    ready = client.get("/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "moss-transcribe-diarize-tiny"


def test_request_ledger_gets_one_line_per_response(fake_client: AppFactory, tmp_path) -> None:
    client, _ = fake_client()
    post(client, make_wav(4.0))
    post(client, make_wav(4.0), max_completion_tokens="10")
    lines = ledger_lines(client)
    assert [line["stop"]["stop"] for line in lines] == ["eos", "max_tokens"]
    assert lines[1]["budget"]["max_tokens"] == 10
    assert all(line["fingerprint"] == "f" * 64 and len(line["audio_sha256"]) == 64 for line in lines)


# ---- error paths: every one the API promises ------------------------------------------------


def assert_error(response, status: int, code: str, *, param: str | None = None, contains: str = "") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    assert contains.lower() in error["message"].lower()
    return error


def test_no_file(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    assert_error(client.post("/v1/audio/transcriptions", data={"model": "x"}), 400, "missing_file", param="file")


def test_empty_file(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    assert_error(post(client, b""), 400, "empty_file", contains="empty")


def test_not_audio(fake_client: AppFactory) -> None:
    client, engine = fake_client()
    assert_error(post(client, b"this is not audio at all" * 100), 400, "invalid_audio")
    assert engine.requests == []


def test_unsupported_container(fake_client: AppFactory) -> None:
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="avi") as container:
        stream = container.add_stream("pcm_s16le", rate=16000, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 16000), dtype=np.int16), format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    client, _ = fake_client()
    assert_error(post(client, buffer.getvalue(), filename="clip.avi"), 415, "unsupported_media_type", contains="avi")


def test_audio_too_short(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    assert_error(post(client, make_wav(0.05)), 400, "audio_too_short", contains="0.050 s")


def test_audio_too_long(fake_client: AppFactory) -> None:
    client, _ = fake_client(audio={"max_duration_s": 5.0})
    assert_error(post(client, make_wav(6.0)), 400, "audio_too_long", contains="5 s")


def test_audio_over_encoder_budget_is_refused_with_numbers() -> None:
    from service.budget import BudgetPolicy, EngineLimits, plan_budget
    from service.errors import GatewayError

    with pytest.raises(GatewayError) as caught:
        plan_budget(
            duration_s=200.0, num_samples=3_200_000, prompt_tokens=2600, requested_max_tokens=None,
            policy=BudgetPolicy(12.75, 20.0, 64),
            limits=EngineLimits(max_model_len=100_000, encoder_budget_tokens=2048, kv_bytes_per_token_bf16=1),
        )
    assert caught.value.code.value == "encoder_budget_exceeded"
    assert caught.value.status == 400
    assert "2500 audio tokens" in caught.value.message and "2048" in caught.value.message


def test_settings_refuse_an_encoder_budget_below_the_longest_input() -> None:
    from pydantic import ValidationError

    from service.settings import GatewaySettings

    with pytest.raises(ValidationError, match="cannot hold the 1250 audio tokens"):
        GatewaySettings(audio={"max_duration_s": 100.0}, engine={"model": "/m", "max_num_batched_tokens": 1000})


def test_context_too_small_is_refused_with_numbers(fake_client: AppFactory) -> None:
    client, engine = fake_client(FakeEngine(max_model_len=300))
    error = assert_error(post(client, make_wav(20.0)), 400, "context_length_exceeded")
    assert "300" in error["message"]
    assert engine.requests == []


def test_explicit_budget_over_context_room(fake_client: AppFactory) -> None:
    client, _ = fake_client(FakeEngine(max_model_len=1000))
    assert_error(post(client, make_wav(2.0), max_completion_tokens="5000"), 400, "context_length_exceeded",
                 param="max_completion_tokens")


def test_upload_over_size_cap(fake_client: AppFactory) -> None:
    client, engine = fake_client(audio={"max_upload_bytes": 1000})
    assert_error(post(client, make_wav(5.0)), 413, "upload_too_large", contains="1000 bytes")
    assert engine.requests == []


def test_unknown_response_format(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    assert_error(post(client, make_wav(2.0), response_format="mp3"), 400, "invalid_response_format",
                 param="response_format", contains="diarized_json")


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_format_that_cannot_stream(fake_client: AppFactory, fmt: str) -> None:
    client, _ = fake_client()
    assert_error(post(client, make_wav(2.0), response_format=fmt, stream="true"), 400,
                 "stream_not_supported_for_format", param="stream")


@pytest.mark.parametrize("value", ["-5", "0", "abc", "99999999"])
def test_negative_or_absurd_budget(fake_client: AppFactory, value: str) -> None:
    client, _ = fake_client()
    assert_error(post(client, make_wav(2.0), max_completion_tokens=value), 400, "invalid_max_completion_tokens")


def test_conflicting_budget_alias(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    assert_error(post(client, make_wav(2.0), max_completion_tokens="10", max_new_tokens="20"), 400,
                 "invalid_max_completion_tokens", param="max_new_tokens")


def test_bad_temperature(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    assert_error(post(client, make_wav(2.0), temperature="7"), 400, "invalid_request", param="temperature")


def test_word_timestamps_are_refused(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    assert_error(post(client, make_wav(2.0), **{"timestamp_granularities[]": ["word"]}), 400, "invalid_request")


def test_unknown_model(fake_client: AppFactory) -> None:
    client, _ = fake_client()
    assert_error(post(client, make_wav(2.0), model="whisper-9"), 404, "model_not_found", param="model")


def test_not_qualified_is_503_with_how_to(fake_client: AppFactory) -> None:
    client, engine = fake_client(qualified=False)
    error = assert_error(post(client, make_wav(2.0)), 503, "backend_not_qualified", contains="moss-gateway qualify")
    assert "not qualified" in error["message"]
    ready = client.get("/ready")
    assert ready.status_code == 503
    assert any("not qualified" in reason for reason in ready.json()["reasons"])
    assert engine.requests == []


def test_a_dead_engine_refuses_new_requests_with_503(fake_client: AppFactory) -> None:
    engine = FakeEngine()
    client, _ = fake_client(engine, lifecycle={"restart_engine": False})
    engine.dead = True
    error = assert_error(post(client, make_wav(2.0)), 503, "engine_not_ready")
    assert "Retry" in error["message"]


def test_nan_audio_is_refused(fake_client: AppFactory) -> None:
    buffer = io.BytesIO()
    samples = np.zeros(16000, dtype=np.float32)
    samples[100] = np.nan
    sf.write(buffer, samples, 16000, format="WAV", subtype="FLOAT")
    client, engine = fake_client()
    assert_error(post(client, buffer.getvalue()), 400, "invalid_audio")
    assert engine.requests == []


def test_metrics_count_requests_and_stops(fake_client: AppFactory) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    client, _ = fake_client()
    post(client, make_wav(4.0))
    post(client, make_wav(2.0), response_format="bogus")
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    requests = {
        (s.labels["route"], s.labels["status"], s.labels["error_code"]): s.value
        for s in families["moss_gateway_requests"].samples if s.name.endswith("_total")
    }
    assert requests[("/v1/audio/transcriptions", "200", "")] == 1
    assert requests[("/v1/audio/transcriptions", "400", "invalid_response_format")] == 1
    stops = {s.labels["stop"]: s.value for s in families["moss_gateway_stops"].samples if s.name.endswith("_total")}
    assert stops["eos"] == 1


def _server_timing(value: str) -> dict[str, float]:
    """`name;dur=ms, ...` into {name: ms}; every entry must have a duration."""
    phases = {}
    for entry in value.split(","):
        name, _, duration = entry.strip().partition(";dur=")
        phases[name] = float(duration)
    return phases


def test_server_timing_splits_the_request(fake_client: AppFactory) -> None:
    """The W3C header a load test (bench.client) and a browser read: the phases fit inside the total."""
    client, _ = fake_client()
    response = post(client, make_wav(4.0), response_format="json")
    assert response.status_code == 200
    phases = _server_timing(response.headers["server-timing"])
    assert {"prepare", "total"} <= set(phases)
    assert all(ms >= 0 for ms in phases.values())
    inside = phases["prepare"] + phases.get("features", 0.0)
    assert inside <= phases["total"] + 0.05
    verbose = post(client, make_wav(4.0), response_format="verbose_json")
    reported = verbose.json()["moss"]["timings"]["total_s"] * 1000
    assert _server_timing(verbose.headers["server-timing"])["total"] == pytest.approx(reported, abs=1.0)
