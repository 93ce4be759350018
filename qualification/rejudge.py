"""Re-judge a stored qualification record under another near-tie margin, offline.

A record keeps everything its verdict was made from: the reference's greedy run,
the engine's runs and, where they differ, the reference teacher-forced along them
(`reference_forced`: top id, top log-probability, engine token's log-probability
per position). A margin calibrated on the served checkpoint and hardware changes
only the threshold, so the verdict under it follows from the record alone, with
the gate's own rule (`parity.compare_runs`) and no model run. It also reports the
smallest margin each run would pass with, so that a calibration can be read
against it. The record is read, never written: this is an analysis, not a
qualification, and its answer opens no gate.

    python -m qualification.rejudge RECORD.json --margin 1.75
    python -m qualification.rejudge RECORD.json --calibration qualification/calibration/X.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from qualification.parity import ForcedStep, ParityResult, compare_runs


def forced_steps(run: dict[str, Any]) -> list[ForcedStep] | None:
    """The run's stored teacher-forced reference scores as parity's steps (None when not stored)."""
    stored = run.get("reference_forced")
    if stored is None:
        return None
    return [ForcedStep(int(top), float(top_lp), float(token_lp)) for top, top_lp, token_lp in stored]


def needed_margin(run: dict[str, Any]) -> float | None:
    """The smallest margin under which every engine token of `run` is within reach of the top choice.

    None when the run has no stored scores (it matched the reference, or the record lacks them).
    """
    steps = forced_steps(run)
    if steps is None:
        return None
    return max([0.0, *(step.gap for token, step in zip(run["token_ids"], steps, strict=True) if token != step.top_id)])


def judge_run(record: dict[str, Any], run: dict[str, Any], margin: float) -> ParityResult:
    """One engine run of the record judged as the gate would, with `margin` in place of the record's."""
    reference = record["reference"]
    result = compare_runs(
        reference_ids=reference["token_ids"], reference_stop=reference["stop"],
        candidate_ids=run["token_ids"], candidate_stop=run["stop"],
        forced=forced_steps(run), policy=record["verdict"]["policy"], margin=margin,
    )
    if record.get("prompt", {}).get("engine_token_ids_match") is False:
        # The gate fails a run whose prompt differs from the reference's, whatever the tokens say.
        return dataclasses.replace(
            result, verdict="failed", passed=False, explanation=f"the engine's prompt IDs differ; {result.explanation}"
        )
    return result


def engine_runs(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The judged runs by name: the clip alone and the clip in the batch, per data-parallel rank if any."""
    ranks = record.get("ranks")
    if not ranks:
        return {"single": record["candidate"], "batched": record["batched"]["clip_run"]}
    runs = {}
    for rank in ranks:
        runs[f"rank{rank['rank']}/single"] = rank["candidate"]
        runs[f"rank{rank['rank']}/batched"] = rank["batched_clip_run"]
    return runs


def rejudge(record: dict[str, Any], margin: float) -> dict[str, Any]:
    """Every judged run of `record` under `margin`, beside the record's own verdict; passed only if all pass."""
    runs = {}
    for name, run in engine_runs(record).items():
        result = judge_run(record, run, margin)
        runs[name] = {
            "verdict": result.verdict, "passed": result.passed, "near_ties": result.near_ties,
            "largest_margin_used": result.largest_margin_used, "first_failure": result.first_failure,
            "needed_margin": needed_margin(run), "explanation": result.explanation,
        }
    return {
        "qualification_id": record.get("qualification_id"),
        "record_margin": record["verdict"]["near_tie_logprob_margin"],
        "record_passed": record["verdict"]["passed"] and record["verdict"].get("batched_passed", True),
        "margin": margin,
        "passed": all(run["passed"] for run in runs.values()),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Re-judge a qualification record under another margin (read-only).")
    parser.add_argument("record", type=Path)
    margin = parser.add_mutually_exclusive_group(required=True)
    margin.add_argument("--margin", type=float, help="The near-tie margin in nats.")
    margin.add_argument("--calibration", type=Path, help="A qualification.calibrate result: its suggested margin.")
    args = parser.parse_args(argv)
    value = args.margin if args.calibration is None else json.loads(args.calibration.read_text())["suggested_margin"]
    result = rejudge(json.loads(args.record.read_text()), value)
    if args.calibration is not None:
        result["calibration"] = str(args.calibration)
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
