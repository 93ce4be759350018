"""`moss-gateway evaluate` against the real gateway on the tiny checkpoint.

The tiny checkpoint was taught to write the frozen clip's transcript, so the clip
with its true gold must score CER 0 and DER 0, and a deliberately wrong gold must
score exactly the error worked out by hand below. The synthetic espeak-ng set then
runs end to end on both tracks into separate reports (the numbers mean nothing about
quality on the tiny checkpoint; the pipeline is real), and the two are compared.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from gateway_process import GatewayProcess, run_cli

from qualification.clip import FROZEN_CLIP_PATH, FROZEN_CLIP_SEGMENTS
from service.evaluation.gold import Turn, write_seglst, write_stm
from service.evaluation.goldset import write_set

pytestmark = pytest.mark.engine


def evaluate(gateway: GatewayProcess, manifest: Path, out: Path, *extra: str) -> dict[str, Any]:
    result = run_cli("evaluate", str(manifest), "--url", gateway.url, "--out", str(out), "--bootstrap-samples", "200",
                     *extra, env=gateway.env)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{gateway.log_tail()}"
    return json.loads((out / "report.json").read_text())


def fingerprint(gateway: GatewayProcess) -> str:
    with gateway.client() as client:
        return str(client.get("/v1/backend").json()["fingerprint"])


@pytest.fixture(scope="module")
def clip_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("eval-clip")
    shutil.copy(FROZEN_CLIP_PATH, base / "clip.wav")
    true_gold = [Turn(start, end, speaker, text) for start, end, speaker, text in FROZEN_CLIP_SEGMENTS]
    write_seglst(base / "clip.json", "clip", true_gold)
    # The wrong gold: "morning" -> "evening" in the first turn, and the last turn given to S01.
    wrong = [Turn(0.50, 1.68, "S01", "Good evening everyone."), *true_gold[1:3],
             Turn(7.60, 9.24, "S01", "Thank you, see you soon.")]
    write_stm(base / "wrong.stm", "clip", wrong)
    lines = [{"id": "clip", "audio": "clip.wav", "gold": "clip.json"},
             {"id": "clip-wrong-gold", "audio": "clip.wav", "gold": "wrong.stm"}]
    (base / "manifest.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return base / "manifest.jsonl"


def test_frozen_clip_true_gold_scores_zero_and_wrong_gold_the_hand_computed_error(
    qualified_gateway: GatewayProcess, clip_manifest: Path, tmp_path: Path
) -> None:
    built = evaluate(qualified_gateway, clip_manifest, tmp_path / "out", "--track", "both")
    assert set(built["tracks"]) == {"native", "chunked"}
    for track in ("native", "chunked"):
        section = built["tracks"][track]
        assert section["backend"]["fingerprints"] == [fingerprint(qualified_gateway)]
        assert section["backend"]["qualification_ids"] and all(i["track"] == track for i in section["items"])
    items = {i["id"]: i for i in built["tracks"]["native"]["items"]}
    clip = items["clip"]
    assert clip["status"] == "ok" and clip["stop"] == "eos"
    assert (clip["cer"], clip["wer"], clip["cpcer"], clip["cpwer"], clip["der"], clip["jer"]) == (0, 0, 0, 0, 0, 0)
    assert clip["speaker_count_error"] == 0 and clip["tail_coverage"] == 1.0
    wrong = items["clip-wrong-gold"]
    # Characters: goodmorningeveryone(19) thepipelineisready(18) letuscheckthenumbers(20) thankyouseeyousoon(18) = 75;
    # morning/evening differ in m,o,r vs e,v,e: 3 substitutions. CER 3/75; WER 1 substitution in 17 words.
    assert wrong["cer"] == pytest.approx(3 / 75, abs=1e-6)
    assert wrong["wer"] == pytest.approx(1 / 17, abs=1e-6)
    # cpWER, mapping S01->S01, S02->S02: gold S01 (13 words) vs hyp S01 (8): 1 substitution + 5 deletions;
    # gold S02 (4) vs hyp S02 (9): 5 insertions. 11/17 (the crossed mapping costs at least 7 + 7).
    assert wrong["cpwer"] == pytest.approx(11 / 17, abs=1e-6)
    # DER, collar 0.25 s: scored speech (1.18-0.5)+(1.11-0.5)+(1.43-0.5)+(1.64-0.5) = 3.36 s; the last turn's scored
    # 7.85-8.99 s (1.14 s) is confused (gold S01, hypothesis S02 mapped to gold S02). 1.14/3.36.
    assert wrong["der"] == pytest.approx(1.14 / 3.36, abs=1e-6)
    assert wrong["diarization"]["confusion_s"] == pytest.approx(1.14, abs=1e-6)
    assert built["tracks"]["native"]["overall"]["cer"] == pytest.approx(3 / 150, abs=1e-6)
    report_md = (tmp_path / "out" / "report.md").read_text()
    assert "## Track: native" in report_md and "## Track: chunked" in report_md


@pytest.fixture(scope="module")
def synthetic_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is missing; scripts/bootstrap installs it")
    return write_set(tmp_path_factory.mktemp("goldset"), native_limit_s=120)


def test_synthetic_set_runs_on_both_tracks_into_separate_reports(
    qualified_gateway: GatewayProcess, synthetic_manifest: Path, tmp_path: Path
) -> None:
    native = evaluate(qualified_gateway, synthetic_manifest, tmp_path / "native", "--track", "native")
    chunked = evaluate(qualified_gateway, synthetic_manifest, tmp_path / "chunked", "--track", "chunked")
    assert list(native["tracks"]) == ["native"] and list(chunked["tracks"]) == ["chunked"]
    native_ids = [i["id"] for i in native["tracks"]["native"]["items"]]
    chunked_ids = [i["id"] for i in chunked["tracks"]["chunked"]["items"]]
    assert native_ids == ["dialogue-short", "meeting-overlap"]  # program-long is over the tiny native limit
    assert chunked_ids[:2] == native_ids and [i for i in chunked_ids if i.startswith("program-long@")] == [
        "program-long@0-600s", f"program-long@600-{chunked['cuts']['program-long']['cuts'][-1]:g}s"
    ]
    assert chunked["cuts"]["program-long"]["cuts"][-1] > 600
    fp = fingerprint(qualified_gateway)
    for report, track in ((native, "native"), (chunked, "chunked")):
        section = report["tracks"][track]
        assert section["overall"]["failed"] == 0 and section["backend"]["fingerprints"] == [fp]
        for item in section["items"]:
            assert item["status"] == "ok" and item["backend"]["fingerprint"] == fp
            for metric in ("cer", "wer", "cpcer", "der", "jer"):
                assert isinstance(item[metric], float) and item[metric] >= 0, (item["id"], metric, item[metric])
        for name in ("cer", "coverage", "drift"):
            assert (tmp_path / track / f"{name}_{track}.png").is_file()
    result = run_cli("evaluate", "--compare", str(tmp_path / "native" / "report.json"),
                     str(tmp_path / "chunked" / "report.json"), "--tracks", "native:chunked",
                     "--out", str(tmp_path / "compare"), env=qualified_gateway.env)
    assert result.returncode == 0, result.stderr
    (comparison,) = json.loads((tmp_path / "compare" / "compare.json").read_text())
    assert comparison["paired_items"] == ["dialogue-short", "meeting-overlap"]
    assert all(row["n"] == 2 for row in comparison["metrics"].values() if row["a"] is not None)
