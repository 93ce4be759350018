"""The data-parallel bench's logic (bench.dp) on CPU: schedule, rows, summary, targets, report."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import dp


def test_every_block_runs_in_every_repetition_in_a_rotated_order() -> None:
    names = dp.blocks()
    plan = dp.schedule(names, 3)
    assert len(plan) == 15
    for repeat in range(3):
        blocks = sorted((c, d) for r, c, d in plan if r == repeat)
        assert blocks == sorted([(dp.SHORT_CELL, 1), (dp.SHORT_CELL, 2), (dp.SCALED_CELL, 2), (dp.PROGRAM_CELL, 2), (dp.PROGRAM_CELL, 1)])
    firsts = [next((c, d) for r, c, d in plan if r == repeat) for repeat in range(3)]
    assert len(set(firsts)) == 3  # no block always runs first


def rows(short_walls: dict[int, list[float]], program_walls: list[float]) -> list[dict]:
    out = []
    for d, walls in short_walls.items():
        for repeat, wall in enumerate(walls):
            out.append(dp.dp_row(cell=dp.SHORT_CELL, repeat=repeat, wall_s=wall, requests=128, dp=d, ok=128, audio_s=12.0))
    for repeat, wall in enumerate(program_walls):
        out.append(dp.dp_row(cell=dp.PROGRAM_CELL, repeat=repeat, wall_s=wall, requests=1, dp=2, ok=1, audio_s=2861.5))
    return out


def test_rows_carry_the_fields_the_issue_names() -> None:
    row = rows({1: [4.0]}, [])[0]
    assert {"cell", "path", "repeat", "wall_s", "requests", "dp"} <= set(row)
    assert row["path"] == "gateway"


def test_the_ratio_is_per_repetition_and_the_targets_are_judged() -> None:
    summary = dp.summarize(rows({1: [4.0, 4.4, 3.8], 2: [2.0, 2.4, 2.0]}, [7.5, 7.9, 8.6]))
    assert summary["short_ratio_per_repeat"] == [2.0, round(4.4 / 2.4, 4), 1.9]
    assert summary["short_ratio_median"] == 1.9 and summary["targets"]["short_ratio"]["met"] is True
    assert summary["program_dp2_median_s"] == 7.9 and summary["targets"]["program_dp2_s"]["met"] is True
    cell = summary["cells"][dp.SHORT_CELL]["1"]
    assert cell["median_wall_s"] == 4.0 and round(cell["median_audio_s_per_s"]) == 384


def test_the_scaled_ratio_compares_the_same_batch_per_gpu() -> None:
    data = rows({1: [4.0, 4.0, 4.0], 2: [3.0, 3.0, 3.0]}, [])
    for repeat, wall in enumerate([4.2, 4.0, 8.0]):
        data.append(dp.dp_row(cell=dp.SCALED_CELL, repeat=repeat, wall_s=wall, requests=256, dp=2, ok=256, audio_s=12.0))
    summary = dp.summarize(data)
    assert summary["scaled_ratio_per_repeat"] == [round((256 / 4.2) / (128 / 4.0), 4), 2.0, 1.0]
    assert summary["scaled_ratio_median"] == round((256 / 4.2) / (128 / 4.0), 4)
    assert "dp=2 at 256 streams / dp=1 at 128" in dp.render(summary)


def test_a_block_with_failed_requests_counts_for_no_ratio() -> None:
    data = rows({1: [4.0], 2: [1.0]}, [9.0])
    data[1]["ok"] = 100  # dp=2 answered 100 of 128: its wall time says nothing about throughput
    summary = dp.summarize(data)
    assert summary["short_ratio_per_repeat"] == [] and summary["targets"]["short_ratio"]["met"] is None
    assert summary["targets"]["program_dp2_s"]["met"] is False


def test_the_report_table_and_plot(tmp_path: Path) -> None:
    summary = dp.summarize(rows({1: [4.0], 2: [2.0]}, [7.0]))
    table = dp.render(summary)
    assert f"| {dp.SHORT_CELL} | 2 | 2.00 | 768 |" in table and "median 2.00x" in table
    assert dp.plot(summary, tmp_path / "dp.png").stat().st_size > 0


def test_the_two_gateways_differ_only_in_dp_and_devices() -> None:
    args = argparse.Namespace(
        state_dir="/s", model="/m", max_model_len=1, max_num_batched_tokens=2, max_num_seqs=3,
        gpu_memory_utilization=0.4, kv_cache_memory_bytes=5, api_processes=4,
    )
    one, two = (dp.gateway_env(args, dp=d, port=1, token="t") for d in (1, 2))
    differ = {k for k in one.keys() | two.keys() if one.get(k) != two.get(k)}
    assert differ == {"CUDA_VISIBLE_DEVICES", "MOSS_GATEWAY_ENGINE__DATA_PARALLEL_SIZE", "MOSS_GATEWAY_STATE_DIR"}
    assert two["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert one["MOSS_GATEWAY_SERVER__API_PROCESSES"] == two["MOSS_GATEWAY_SERVER__API_PROCESSES"] == "4"
