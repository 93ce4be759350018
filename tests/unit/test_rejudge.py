"""Offline re-judging of stored qualification records under another near-tie margin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qualification.rejudge import main, needed_margin, rejudge

GPU_RECORD = Path(__file__).resolve().parents[2] / "bench" / "results" / "h200x2-2026-11-30-b" / "q-e66442d54dcd47bc.json"


def record(*, forced: list[list[float]] | None, prompt_match: bool = True) -> dict[str, Any]:
    """Reference 1 2 3; the engine 1 4 3 with token 4 scored 0.5 nats below the top (2) at position 1."""
    run = {"token_ids": [1, 4, 3], "stop": "max_tokens", "reference_forced": forced}
    return {
        "qualification_id": "q-test",
        "prompt": {"engine_token_ids_match": prompt_match},
        "reference": {"token_ids": [1, 2, 3], "stop": "max_tokens"},
        "candidate": run,
        "batched": {"clip_run": run},
        "verdict": {"policy": "explainable", "near_tie_logprob_margin": 0.1, "passed": False, "batched_passed": False},
    }


FORCED = [[1, -0.1, -0.1], [2, -0.2, -0.7], [3, -0.3, -0.3]]


def test_the_verdict_follows_the_margin() -> None:
    assert not rejudge(record(forced=FORCED), 0.4)["passed"]
    result = rejudge(record(forced=FORCED), 0.5)
    assert result["passed"] and result["record_margin"] == 0.1 and not result["record_passed"]
    assert result["runs"]["single"]["verdict"] == "explained"
    assert result["runs"]["batched"]["largest_margin_used"] == pytest.approx(0.5)


def test_needed_margin_is_the_largest_gap_of_a_non_top_token() -> None:
    assert needed_margin(record(forced=FORCED)["candidate"]) == pytest.approx(0.5)
    assert needed_margin(record(forced=None)["candidate"]) is None


def test_a_record_without_scores_or_with_another_prompt_stays_failed() -> None:
    assert rejudge(record(forced=None), 10.0)["runs"]["single"]["verdict"] == "failed"
    failed = rejudge(record(forced=FORCED, prompt_match=False), 10.0)["runs"]["single"]
    assert failed["verdict"] == "failed" and "prompt" in failed["explanation"]


def test_data_parallel_records_are_judged_rank_by_rank() -> None:
    data = record(forced=FORCED)
    good = {"token_ids": [1, 2, 3], "stop": "max_tokens", "reference_forced": None}
    data["ranks"] = [
        {"rank": 0, "candidate": good, "batched_clip_run": good},
        {"rank": 1, "candidate": data["candidate"], "batched_clip_run": good},
    ]
    result = rejudge(data, 0.4)
    assert set(result["runs"]) == {"rank0/single", "rank0/batched", "rank1/single", "rank1/batched"}
    assert [name for name, run in result["runs"].items() if not run["passed"]] == ["rank1/single"]


def test_the_gpu_record_under_its_own_margin_keeps_its_verdict() -> None:
    """The stored evidence reproduces the record's verdict, so a re-judgement changes only the margin."""
    stored = json.loads(GPU_RECORD.read_text())
    again = rejudge(stored, stored["verdict"]["near_tie_logprob_margin"])
    assert again["runs"]["single"]["first_failure"] == stored["verdict"]["evidence"]["first_failure"] == 2
    assert again["passed"] is stored["verdict"]["passed"] is False


def test_main_reads_the_margin_from_a_calibration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "r.json").write_text(json.dumps(record(forced=FORCED)))
    (tmp_path / "c.json").write_text(json.dumps({"suggested_margin": 0.6}))
    assert main([str(tmp_path / "r.json"), "--calibration", str(tmp_path / "c.json")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["margin"] == 0.6 and out["passed"]
