"""The data-parallel bench's logic (bench.dp) on CPU: schedule, rows, summary, targets, report."""

from __future__ import annotations

import argparse
import asyncio
import lzma
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import dp
from bench.workloads import PROGRAM_DURATION_S, noise_pcm16
from service.engine.protocol import EngineTimings
from service.settings import GatewaySettings


def test_every_block_runs_in_every_repetition_in_a_rotated_order() -> None:
    names = dp.blocks()
    plan = dp.schedule(names, 3)
    assert len(plan) == 18
    for repeat in range(3):
        blocks = sorted((c, d) for r, c, d in plan if r == repeat)
        assert blocks == sorted([(dp.SHORT_CELL, "1"), (dp.SHORT_CELL, "2"), (dp.HALF_CELL, "1"), (dp.SCALED_CELL, "2"),
                                 (dp.PROGRAM_CELL, "2"), (dp.PROGRAM_CELL, "1")])
    firsts = [next((c, d) for r, c, d in plan if r == repeat) for repeat in range(3)]
    assert len(set(firsts)) == 3  # no block always runs first


def test_a_program_only_run_has_no_short_blocks() -> None:
    names = dp.blocks(short=[], program=["2", "1"], scaled=False)  # no dp=1 short cell: no half cell either
    assert names == [f"{dp.PROGRAM_CELL}@2", f"{dp.PROGRAM_CELL}@1"]
    assert len(dp.schedule(names, 3)) == 6


def rows(short_walls: dict[int, list[float]], program_walls: list[float]) -> list[dict]:
    out = []
    for d, walls in short_walls.items():
        for repeat, wall in enumerate(walls):
            out.append(dp.dp_row(cell=dp.SHORT_CELL, repeat=repeat, wall_s=wall, requests=128, dp=d, ok=128, audio_s=12.0))
    for repeat, wall in enumerate(program_walls):
        out.append(dp.dp_row(cell=dp.PROGRAM_CELL, repeat=repeat, wall_s=wall, requests=1, dp=2, ok=1, audio_s=2861.5,
                             generated_tokens=36_500, forced_tokens=36_500))
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
    assert table.splitlines()[2].endswith("| 0 | 0 | - |")  # no rank samples, no CPU figures in these rows
    assert dp.plot(summary, tmp_path / "dp.png").stat().st_size > 0


def bench_args(**overrides: object) -> argparse.Namespace:
    values = dict(
        state_dir="/s", model="/m", max_model_len=1, max_num_batched_tokens=2, max_num_seqs=3,
        gpu_memory_utilization=0.4, kv_cache_memory_bytes=5, api_processes_per_rank=4, chunk_target_s=290.0, requests_per_worker=2,
        renderer_num_workers=None, distributed_executor_backend=None, frontend_torch_threads=None, gpus=2,
    )
    values.update(overrides)
    return argparse.Namespace(**values)


def test_a_program_block_short_of_the_programs_tokens_is_not_a_program_run() -> None:
    """Regression: a run planned 36 chunks while the gateway cut 5, so it forced 5 x 1,014 tokens and looked fast."""
    data = rows({}, [4.0, 4.1, 3.9])
    for row in data[:2]:
        row["generated_tokens"] = row["forced_tokens"] = 5 * 1014
    summary = dp.summarize(data)
    entry = summary["cells"][dp.PROGRAM_CELL]["2"]
    assert entry["incomplete"] == 2 and entry["median_wall_s"] == 3.9
    assert "| 2 |" in dp.render(summary).splitlines()[2]


def test_a_short_block_that_generated_fewer_tokens_than_forced_counts_for_no_ratio() -> None:
    data = rows({1: [4.0], 2: [2.0]}, [])
    for row in data:
        row["forced_tokens"], row["generated_tokens"] = 128 * 153, 128 * 153
    data[1]["generated_tokens"] -= 1
    assert dp.summarize(data)["short_ratio_per_repeat"] == []


def test_the_bench_plans_the_chunks_with_the_gateways_settings() -> None:
    """What the gateways get (environment) and what the bench plans with come from one dict."""
    args = bench_args()
    env = dp.gateway_env(args, target=dp.gateway("1"), port=1, token="t")
    assert env["MOSS_GATEWAY_LONGFORM__TARGET_S"] == "290.0" and env["MOSS_GATEWAY_AUDIO__MAX_DURATION_S"] == "3000"
    chunks, per_chunk = dp.program_plan(args, noise_pcm16(PROGRAM_DURATION_S, 7))
    assert 9 <= chunks <= 11 and per_chunk * chunks >= 36_492 > (per_chunk - 1) * chunks
    served = GatewaySettings(
        audio={"max_duration_s": env["MOSS_GATEWAY_AUDIO__MAX_DURATION_S"]},
        longform={k.removeprefix("MOSS_GATEWAY_LONGFORM__").lower(): v for k, v in env.items() if k.startswith("MOSS_GATEWAY_LONGFORM__")},
    )
    assert served.chunking_defaults()["target_s"] == 290.0 and served.longform.max_concurrent_chunks >= chunks


def test_renderer_workers_and_the_executor_reach_both_gateways_only_when_asked() -> None:
    plain = dp.gateway_env(bench_args(), target=dp.gateway("1"), port=1, token="t")
    assert "MOSS_GATEWAY_ENGINE__RENDERER_NUM_WORKERS" not in plain
    assert "MOSS_GATEWAY_ENGINE__DISTRIBUTED_EXECUTOR_BACKEND" not in plain
    assert "MOSS_GATEWAY_SERVER__FRONTEND_TORCH_THREADS" not in plain
    for d in (1, 2):
        env = dp.gateway_env(bench_args(renderer_num_workers=8, distributed_executor_backend="uni", frontend_torch_threads=4),
                             target=dp.gateway(str(d)), port=1, token="t")
        assert env["MOSS_GATEWAY_ENGINE__RENDERER_NUM_WORKERS"] == "8"
    served = GatewaySettings(engine={
        "renderer_num_workers": env["MOSS_GATEWAY_ENGINE__RENDERER_NUM_WORKERS"],
        "distributed_executor_backend": env["MOSS_GATEWAY_ENGINE__DISTRIBUTED_EXECUTOR_BACKEND"],
    }, server={"frontend_torch_threads": env["MOSS_GATEWAY_SERVER__FRONTEND_TORCH_THREADS"]})
    assert served.engine.renderer_num_workers == 8 and served.engine.distributed_executor_backend == "uni"
    assert served.server.frontend_torch_threads == 4


def test_running_requests_are_read_per_rank_from_metrics() -> None:
    page = "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        'vllm:num_requests_running{engine="0",model_name="m"} 60.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 4.0',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 9.0',
    ])
    assert dp.per_rank(page) == {"0": 60.0, "1": 4.0}
    assert dp.per_rank(page, dp.WAITING) == {"0": 9.0}
    ranks = dp.summarize_ranks([{"0": 0.0, "1": 0.0}, {"0": 60.0, "1": 4.0}, {"0": 40.0, "1": 8.0}])
    assert ranks == {"0": {"max": 60.0, "mean_busy": 50.0, "samples": 2}, "1": {"max": 8.0, "mean_busy": 6.0, "samples": 2}}


def test_short_blocks_send_several_clips_per_stream_from_several_processes() -> None:
    files = {dp.SHORT_CELL: [f"f{i}" for i in range(600)], dp.SCALED_CELL: [f"f{i}" for i in range(600)], dp.PROGRAM_CELL: ["p"]}
    spec = dp.block_spec(dp.SCALED_CELL, url="u", token="t", files=files, program_tokens=9, requests_per_worker=2, processes=8)
    assert spec["concurrency"] == 256 and len(spec["files"]) == 512 and spec["processes"] == 8
    program = dp.block_spec(dp.PROGRAM_CELL, url="u", token="t", files=files, program_tokens=9, requests_per_worker=2, processes=8)
    assert program["output_tokens"] == 9 and program.get("processes", 1) == 1 and program["files"] == ["p"]


def test_the_two_gateways_differ_only_in_dp_devices_and_front_ends_per_rank() -> None:
    args = bench_args()
    one, two = (dp.gateway_env(args, target=dp.gateway(str(d)), port=1, token="t") for d in (1, 2))
    differ = {k for k in one.keys() | two.keys() if one.get(k) != two.get(k)}
    assert differ == {"CUDA_VISIBLE_DEVICES", "MOSS_GATEWAY_ENGINE__DATA_PARALLEL_SIZE", "MOSS_GATEWAY_STATE_DIR",
                      "MOSS_GATEWAY_SERVER__API_PROCESSES"}
    assert two["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert (one["MOSS_GATEWAY_SERVER__API_PROCESSES"], two["MOSS_GATEWAY_SERVER__API_PROCESSES"]) == ("4", "8")


def test_the_half_cell_separates_data_parallel_scaling_from_one_gpus_batch_gain() -> None:
    """dp=2 at 128 over dp=1 at 64 (each GPU at 64 streams) and dp=1 at 128 over dp=1 at 64, per repetition."""
    data = rows({1: [4.0, 4.0], 2: [3.0, 2.5]}, [])
    for repeat, wall in enumerate([6.0, 5.0]):
        data.append(dp.dp_row(cell=dp.HALF_CELL, repeat=repeat, wall_s=wall, requests=64, dp=1, ok=64, audio_s=12.0))
    summary = dp.summarize(data)
    assert summary["rank_scaling_ratio_per_repeat"] == [round((128 / 3.0) / (64 / 6.0), 4), round((128 / 2.5) / (64 / 5.0), 4)]
    assert summary["batch_gain_ratio_per_repeat"] == [3.0, 2.5]
    assert summary["scaled_ratio_per_repeat"] == [] and summary["scaled_ratio_median"] is None
    table = dp.render(summary)
    assert "data parallelism's own scaling" in table and "one GPU's gain" in table and "same batch on every GPU" not in table
    spec = dp.block_spec(dp.HALF_CELL, url="u", token="t", files={dp.HALF_CELL: [f"f{i}" for i in range(600)]},
                         program_tokens=9, requests_per_worker=3, processes=8)
    assert spec["concurrency"] == 64 and len(spec["files"]) == 192


def test_waiting_requests_are_averaged_over_the_busy_samples() -> None:
    sampler = dp.RankSampler("http://unused")
    sampler.samples = [{"0": 0.0}, {"0": 10.0}, {"0": 20.0}]
    sampler.waiting = [{"0": 50.0}, {"0": 4.0}, {"0": 0.0}]  # the idle sample's queue does not count
    ranks = asyncio.run(sampler.stop())
    assert ranks["0"]["mean_busy"] == 15.0 and ranks["0"]["waiting_mean_busy"] == 2.0


def test_process_roles_come_from_the_titles_the_gateway_and_vllm_set() -> None:
    titles = {
        "moss-gateway::frontend-3": "frontend-3", "VLLM::EngineCore_DP1": "engine-core-DP1",
        "VLLM::EngineCore": "engine-core", "VLLM::DPCoordinator": "dp-coordinator", "VLLM::Worker_DP1": "worker-DP1",
        "/usr/bin/python3 -m bench.dp serve --allow-unqualified": "parent", "python3 -c pass": "other",
    }
    assert {title: dp.process_role(title) for title in titles} == titles


def test_the_table_shows_each_blocks_occupancy_and_busiest_front_end() -> None:
    data = rows({1: [4.0, 5.0]}, [])
    for row, share in zip(data, (0.9, 0.7), strict=True):
        row["running_per_rank"] = {"0": {"max": 64.0, "mean_busy": 40.0 * share, "samples": 9}}
        row["cpu"] = {"busiest_frontend_share": share}
    line = dp.render(dp.summarize(data)).splitlines()[2]
    assert line.endswith("| 36, 28 | 0.90, 0.70 |")


def test_a_blocks_cpu_names_the_busiest_front_end_and_the_cost_per_request() -> None:
    before = {10: ("frontend-0", 1.0), 11: ("frontend-1", 2.0), 12: ("engine-core", 5.0)}
    after = {10: ("frontend-0", 10.0), 11: ("frontend-1", 6.0), 12: ("engine-core", 12.0), 13: ("parent", 0.5)}
    cpu = dp.cpu_of_block(before, after, wall_s=10.0, requests=130)
    assert cpu["cpu_s"] == {"frontend-0": 9.0, "frontend-1": 4.0, "engine-core": 7.0, "parent": 0.5}
    assert cpu["busiest_frontend_share"] == 0.9 and cpu["core_share"]["engine-core"] == 0.7
    assert cpu["frontend_cpu_ms_per_request"] == 100.0


def test_a_process_that_ended_during_the_block_subtracts_nothing() -> None:
    """Regression: summed per role, a helper process gone by the block's end made run e's `other` -1.656 s."""
    before = {20: ("other", 1.7), 21: ("other", 0.1), 22: ("engine-core", 3.0)}
    after = {21: ("other", 0.4), 22: ("engine-core", 5.0)}
    assert dp.cpu_of_block(before, after, wall_s=2.0, requests=1)["cpu_s"] == {"other": 0.3, "engine-core": 2.0}


def test_the_cpu_of_a_real_process_group_is_counted_per_role() -> None:
    """This test process and a child that burns CPU under a front end's title (the role comes from its command line)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys,time\nend=time.process_time()+0.3\nwhile time.process_time()<end: pass\ntime.sleep(30)",
                              "moss-gateway::frontend-7"])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and dp.group_cpu_s(os.getpid()).get(child.pid, ("", 0.0))[1] < 0.25:
            time.sleep(0.1)
        spent = dp.group_cpu_s(os.getpid())
        assert spent[child.pid][0] == "frontend-7" and spent[child.pid][1] >= 0.25
        assert spent[os.getpid()][0] == "other" and spent[os.getpid()][1] > 0
    finally:
        child.kill()
        child.wait()
    assert dp.group_cpu_s(2**22 + 12345) == {}  # a process that does not exist: nothing, no error


def test_the_gateways_keep_the_callers_revision_label_but_none_of_its_other_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the H200 runs of 2026-11-30 (d) reported the device copy's stale HEAD as the gateway revision."""
    monkeypatch.setenv(dp.REVISION_ENV, "07fa5fa")
    monkeypatch.setenv("MOSS_GATEWAY_ENGINE__MAX_NUM_SEQS", "999")
    env = dp.gateway_env(bench_args(), target=dp.gateway("2"), port=1, token="t")
    assert env[dp.REVISION_ENV] == "07fa5fa" and env["MOSS_GATEWAY_ENGINE__MAX_NUM_SEQS"] == "3"


def _progress_line(at: str, request: str, chunk: int, timings: EngineTimings) -> str:
    """A progress line as service.transcription.engine_pass writes it, with the real EngineTimings.summary."""
    return f"{at} INFO service.transcription.engine_pass: {request}-c{chunk}: 2433/2433 tokens ({timings.summary()})"


def test_chunk_timings_read_the_gateways_own_progress_lines(tmp_path: Path) -> None:
    def timings(features: float, first: float, decode: float) -> EngineTimings:
        return EngineTimings(submitted=0.0, rendered=features, first_token=first, finished=first + decode,
                             engine_queue_s=0.0, engine_prefill_s=0.05, engine_decode_s=decode)

    lines = [
        _progress_line("2026-11-30 23:15:27,100", "trsc-ab12", 0, timings(0.5, 0.6, 9.0)),  # an earlier line of chunk 0
        _progress_line("2026-11-30 23:15:27,764", "trsc-ab12", 0, timings(0.17, 0.24, 5.73)),
        "INFO:     127.0.0.1:54384 - \"GET /metrics HTTP/1.1\" 200 OK",
        _progress_line("2026-11-30 23:15:28,319", "trsc-ab12", 1, timings(0.44, 0.52, 5.50)),
        _progress_line("2026-11-30 23:15:29,000", "trsc-single", 0, timings(0.1, 0.2, 1.0)),  # one pass: not chunked
    ]
    rows = dp.chunk_timings("\n".join(lines))
    assert rows == [{"request": "trsc-ab12", "chunks": 2, "end_spread_s": 0.555, "features_s": [0.17, 0.44],
                     "first_token_s": [0.24, 0.52], "decode_s": [5.5, 5.73]}]
    older = ["2026-11-30 20:14:44,470 INFO service.transcription.engine_pass: trsc-0b4f-c0: 2433/2433 tokens",
             "2026-11-30 20:14:44,857 INFO service.transcription.engine_pass: trsc-0b4f-c2: 2433/2433 tokens"]
    assert dp.chunk_timings("\n".join(older)) == [{"request": "trsc-0b4f", "chunks": 2, "end_spread_s": 0.387}]
    packed = tmp_path / "gateway.log.xz"
    with lzma.open(packed, "wt") as out:
        out.write("\n".join(lines))
    assert dp.chunk_timings(dp.read_log(packed)) == rows


def closed_loop_records(ends: list[list[float]], per_worker: int) -> list[dict]:
    """Records of a closed-loop block: stream w's k-th answer came back at ends[w][k]."""
    return [{"index": w * per_worker + k, "status": 200, "t_end": end, "latency_s": 0.5,
             "server_timing_ms": {"features": 10.0 * (w + 1), "total": 400.0}}
            for w, stream in enumerate(ends) for k, end in enumerate(stream)]


def test_the_steady_window_is_where_every_stream_is_in_its_loop() -> None:
    """It opens at the last stream's first answer and closes at the first stream's last; ramp and drain are outside."""
    ends = [[1.0, 2.0, 3.0, 4.0], [1.5, 2.5, 3.5, 9.0]]  # stream 1's slow last request is the drain
    window = dp.steady_window(closed_loop_records(ends, 4), 4, block_start=0.5)
    # opens at 1.5, closes at 4.0: answers at 2.0, 3.0, 4.0, 2.5, 3.5 are inside
    assert window == {"opens_s": 1.0, "window_s": 2.5, "requests": 5, "requests_per_s": 2.0}
    failed = closed_loop_records(ends, 4)
    failed[0]["status"] = 500  # a stream with a failed answer has no full loop: no window
    assert dp.steady_window(failed, 4, block_start=0.5) is None
    assert dp.steady_window(closed_loop_records([[1.0, 2.0]], 2), 2, block_start=0.0) is None  # too few per stream


def test_steady_ratios_use_the_window_and_the_phase_table_shows_each_block() -> None:
    data = rows({1: [4.0], 2: [3.0]}, [])
    data[0].update(steady={"requests_per_s": 40.0}, phases_ms={"features": 20.0, "total": 800.0, "outside": 90.0})
    data[1].update(steady={"requests_per_s": 76.0}, phases_ms={"features": 10.0, "total": 500.0, "outside": 60.0})
    summary = dp.summarize(data)
    assert summary["short_ratio_per_repeat"] == [round(4.0 / 3.0, 4)]  # the wall-time ratio is unchanged
    assert summary["steady_short_ratio_per_repeat"] == [1.9]
    assert summary["cells"][dp.SHORT_CELL]["2"]["steady_audio_s_per_s"] == [912.0]
    table = dp.render(summary)
    assert "Steady windows (every stream in its loop): dp=2 / dp=1 at 128 streams: median 1.90x" in table
    assert f"| {dp.SHORT_CELL} | 2 | 912 | - | - | - | - | - | 10 | - | - | - | 500 | 60 | - |" in table


def test_phase_medians_split_the_clients_latency() -> None:
    records = closed_loop_records([[1.0, 2.0], [1.5, 2.5]], 2)
    records.append({"index": 9, "status": 500, "latency_s": 99.0})  # failures are not timed
    assert dp.phase_medians(records) == {"features": 15.0, "total": 400.0, "client": 500.0, "outside": 100.0}


def test_each_ranks_step_time_and_tokens_come_from_the_metrics_counters() -> None:
    def page(tokens: dict[str, float], itl_sum: dict[str, float], itl_count: dict[str, float]) -> str:
        lines = []
        for rank in tokens:
            labels = f'{{engine="{rank}",model_name="m"}}'
            lines += [f"vllm:generation_tokens_total{labels} {tokens[rank]}",
                      f"vllm:inter_token_latency_seconds_sum{labels} {itl_sum[rank]}",
                      f"vllm:inter_token_latency_seconds_count{labels} {itl_count[rank]}"]
        return "\n".join(lines)

    before = page({"0": 100.0, "1": 50.0}, {"0": 1.0, "1": 0.5}, {"0": 100.0, "1": 50.0})
    after = page({"0": 1100.0, "1": 1050.0}, {"0": 6.0, "1": 6.5}, {"0": 1100.0, "1": 1050.0})
    deltas = dp.rank_counter_deltas(before, after)
    assert deltas == {"0": {"tokens": 1000.0, "itl_ms": 5.0}, "1": {"tokens": 1000.0, "itl_ms": 6.0}}
    assert dp.rank_counter_deltas("", after)["0"]["tokens"] == 1100.0  # no page before: everything counts
    data = rows({2: [3.0]}, [])
    data[0].update(counters_per_rank=deltas, phases_ms={"total": 500.0})
    assert "| 5.0/6.0 |" in dp.render(dp.summarize(data))


def test_a_gateway_label_names_its_dp_and_the_one_setting_it_changes() -> None:
    assert dp.gateway("2") == dp.Gateway(label="2", dp=2)
    variant = dp.gateway("1-mp-fe32-api8")
    assert (variant.dp, variant.executor, variant.frontend_torch_threads, variant.api_processes_per_rank, variant.base) == (
        1, "mp", 32, 8, "1")
    with pytest.raises(ValueError, match="unknown variant tag"):
        dp.gateway("1-fast")
    with pytest.raises(ValueError, match="unknown variant tag"):
        dp.gateway_labels("1,2-nope")


def test_a_variant_gateway_changes_only_its_own_setting_and_runs_on_the_last_gpu() -> None:
    args = bench_args()
    plain, variant = (dp.gateway_env(args, target=dp.gateway(label), port=1, token="t") for label in ("1", "1-mp-api8"))
    differ = {k for k in plain.keys() | variant.keys() if plain.get(k) != variant.get(k)}
    assert differ == {"CUDA_VISIBLE_DEVICES", "MOSS_GATEWAY_STATE_DIR", "MOSS_GATEWAY_SERVER__API_PROCESSES",
                      "MOSS_GATEWAY_ENGINE__DISTRIBUTED_EXECUTOR_BACKEND"}
    assert (plain["CUDA_VISIBLE_DEVICES"], variant["CUDA_VISIBLE_DEVICES"]) == ("0", "1")
    assert variant["MOSS_GATEWAY_SERVER__API_PROCESSES"] == "8" and variant["MOSS_GATEWAY_ENGINE__DISTRIBUTED_EXECUTOR_BACKEND"] == "mp"
    one_gpu = bench_args(gpus=1)
    assert dp.gateway_env(one_gpu, target=dp.gateway("1-fe32"), port=1, token="t")["CUDA_VISIBLE_DEVICES"] == "0"
    with pytest.raises(ValueError, match="needs 2 GPUs"):
        dp.gateway_env(one_gpu, target=dp.gateway("2"), port=1, token="t")


def test_variants_get_their_own_blocks_and_are_compared_with_the_plain_gateway_of_their_dp() -> None:
    names = dp.blocks(short=["1", "1-mp", "2", "2-uni"], program=[], scaled=False)
    assert names == [f"{dp.SHORT_CELL}@1", f"{dp.SHORT_CELL}@1-mp", f"{dp.SHORT_CELL}@2", f"{dp.SHORT_CELL}@2-uni",
                     f"{dp.HALF_CELL}@1", f"{dp.HALF_CELL}@1-mp"]
    data = []
    for label, d, walls in (("1", 1, [4.0, 4.0]), ("1-mp", 1, [5.0, 4.0]), ("2", 2, [2.0, 2.0]), ("2-uni", 2, [1.6, 2.5])):
        for repeat, wall in enumerate(walls):
            data.append(dp.dp_row(cell=dp.SHORT_CELL, repeat=repeat, wall_s=wall, requests=128, dp=d, ok=128, audio_s=12.0,
                                  label=label))
    summary = dp.summarize(data)
    assert summary["short_ratio_per_repeat"] == [2.0, 2.0]  # the issue's ratio stays plain 2 over plain 1
    assert summary["variants"]["1-mp"][dp.SHORT_CELL]["wall_per_repeat"] == [0.8, 1.0]
    assert summary["variants"]["2-uni"][dp.SHORT_CELL]["over"] == "2"
    assert summary["variants"]["2-uni"][dp.SHORT_CELL]["wall_per_repeat"] == [1.25, 0.8]
    assert f"Variant 1-mp / 1 on {dp.SHORT_CELL}: median 0.90x" in dp.render(summary)
    old = {k: v for k, v in data[0].items() if k != "gateway"}  # rows from before labels: their dp is the label
    assert dp.label_of(old) == "1"


def test_runs_pool_with_their_repetitions_kept_apart_and_a_dp1_variant_can_stand_in_for_dp1() -> None:
    """`report` over several files: a ratio never pairs blocks of two runs; `1-mp` gets the data-parallel ratios too."""
    def run(walls: dict[str, list[float]], half: dict[str, list[float]]) -> dict:
        out = []
        for label, series in walls.items():
            for repeat, wall in enumerate(series):
                out.append(dp.dp_row(cell=dp.SHORT_CELL, repeat=repeat, wall_s=wall, requests=128, dp=int(label[0]), ok=128,
                                     audio_s=12.0, label=label))
        for label, series in half.items():
            for repeat, wall in enumerate(series):
                out.append(dp.dp_row(cell=dp.HALF_CELL, repeat=repeat, wall_s=wall, requests=64, dp=1, ok=64, audio_s=12.0,
                                     label=label))
        return {"rows": out}

    first = run({"1": [4.0], "2": [2.0], "1-mp": [3.2]}, {"1": [2.5], "1-mp": [2.0]})
    second = run({"1": [8.0], "2": [2.0]}, {"1": [5.0]})  # a slower host: its dp=1 must never meet the first run's dp=2
    rows = dp.pooled_rows([first, second])
    assert sorted({row["repeat"] for row in rows}) == [0, 1]
    summary = dp.summarize(rows)
    assert summary["short_ratio_per_repeat"] == [2.0, 4.0]
    against = summary["against_variants"]["1-mp"]
    assert against["short"]["per_repeat"] == [1.6]  # dp=2 at 128 over 1-mp at 128, only where both ran
    assert against["rank_scaling"]["per_repeat"] == [round((128 / 2.0) / (64 / 2.0), 4)]
    assert against["batch_gain"]["per_repeat"] == [round((128 / 3.2) / (64 / 2.0), 4)]
    assert "With 1-mp as dp=1, short: median 1.60x" in dp.render(summary)


def test_the_phase_table_shows_rank_balance_engine_cores_and_front_end_cpu() -> None:
    data = rows({2: [3.0]}, [])
    data[0].update(phases_ms={"total": 500.0},
                   counters_per_rank={"0": {"tokens": 1000.0, "itl_ms": 3.0}, "1": {"tokens": 990.0, "itl_ms": 3.1}},
                   cpu={"busiest_frontend_share": 0.8, "frontend_cpu_ms_per_request": 31.0,
                        "core_share": {"engine-core-DP0": 1.0, "engine-core-DP1": 1.1, "worker": 2.0, "frontend-0": 0.8}})
    assert "| 3.0/3.1 | 1.0 % | 4.1-4.1 | 31.0 |" in dp.render(dp.summarize(data))
    del data[0]["phases_ms"], data[0]["counters_per_rank"]  # a row from before Server-Timing still shows its CPU
    assert f"| {dp.SHORT_CELL} | 2 | - | - | - | 4.1-4.1 | 31.0 |" in dp.render(dp.summarize(data))
