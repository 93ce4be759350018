"""CPU tests of the program benchmark's pure logic (bench.program, bench.decode_profile): no engine, no GPU."""

from __future__ import annotations

import math

import pytest

from bench import decode_profile as dp
from bench import program as pg
from service.settings import GatewaySettings

# -- seconds per step ---------------------------------------------------------------------------


def test_step_time_is_the_slope_even_when_updates_coalesce() -> None:
    # 2 ms a step after a 1.5 s prefill; the front end sometimes delivers 3 tokens at once
    samples, n, t = [], 0, 1.5
    while n < 300:
        k = 3 if n % 50 == 0 else 1
        n += k
        t += 0.002 * k
        samples.append((t, n))
    fit = dp.fit_step_time(samples)
    assert fit is not None
    assert fit["s_per_step"] == pytest.approx(0.002, rel=1e-6)
    assert fit["s_per_step_median_gap"] == pytest.approx(0.002, rel=1e-6)
    assert fit["tokens_fitted"] < 300  # the first tokens are left out


def test_step_time_needs_enough_points() -> None:
    assert dp.fit_step_time([(0.1, 1), (0.2, 2)]) is None
    assert dp.fit_step_time([(0.1 * i, 20) for i in range(5)]) is None  # no progress


def test_counter_windows_give_step_time_against_context() -> None:
    # 4 streams; each step costs 1 ms + 10 ns per token of context; the counter counts all streams
    prompt, streams, samples = 4000, 4, []
    t, per_stream = 0.0, 0
    samples += [(0.2 * i, 0.0) for i in range(15)]  # upload and prefill: the counter stands still
    t = 3.0
    while per_stream < 2000:
        for _ in range(50):
            t += 0.001 + 1e-8 * (prompt + per_stream)
            per_stream += 1
        samples.append((t, float(per_stream * streams)))
    rows = dp.counter_curve(samples, prompt_tokens=prompt, streams=streams, min_tokens=100)
    assert rows and all(r["steps"] >= 100 for r in rows)
    for row in rows:
        assert row["s_per_step"] == pytest.approx(0.001 + 1e-8 * row["context_tokens"], rel=2e-3)
    fit = dp.fit_linear([r["context_tokens"] for r in rows], [r["s_per_step"] for r in rows])
    assert fit is not None
    assert fit["a_s"] == pytest.approx(0.001, rel=0.02) and fit["b_s_per_token"] == pytest.approx(1e-8, rel=0.02)
    binned = dp.bin_curve(rows, width=500)
    assert len(binned) < len(rows) and sum(b["steps"] for b in binned) == pytest.approx(sum(r["steps"] for r in rows))


def test_counter_curve_rejects_no_streams_and_skips_idle_windows() -> None:
    with pytest.raises(ValueError):
        dp.counter_curve([(0.0, 0.0)], prompt_tokens=1, streams=0)
    idle = [(0.1 * i, 0.0) for i in range(10)]
    assert dp.counter_curve(idle, prompt_tokens=10) == []


def test_decode_prediction_is_the_sum_over_steps() -> None:
    a, b, prompt, n = 0.0015, 2.4e-8, 37_979, 1000
    brute = sum(a + b * (prompt + k) for k in range(n))
    assert dp.predict_decode_s(a, b, prompt_tokens=prompt, output_tokens=n) == pytest.approx(brute)
    # the bandwidth bound of bench-host.md: about 57 s for the program
    bound = dp.bandwidth_bound_line(weight_bytes=1.19e9, kv_bytes_per_token=114_688)
    total = dp.predict_decode_s(bound["a_s"], bound["b_s_per_token"], prompt_tokens=37_979, output_tokens=36_492)
    assert 52 < total < 62


def test_fit_linear_needs_two_distinct_points() -> None:
    assert dp.fit_linear([1.0], [2.0]) is None
    assert dp.fit_linear([1.0, 1.0], [2.0, 3.0]) is None


# -- the trace -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("void flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<...>>", "attention"),
        ("kernel_unified_attention_3d", "attention"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64", "gemm"),
        ("nvjet_hsh_64x8_64x16_2x1_v_bz_splitK_TNT", "gemm"),
        ("void at::native::reduce_kernel<512, 1, ArgMaxOps<float>>", "sampling"),
        ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>", "kv_cache_write"),
        ("void vllm::rms_norm_kernel<c10::BFloat16>", "norm_rope_act"),
        ("triton_poi_fused_add_mul_0", "fused_elementwise"),
        ("some_unknown_thing", "other"),
    ],
)
def test_kernel_classes(name: str, label: str) -> None:
    assert dp.classify_kernel(name) == label


def test_interval_union() -> None:
    assert dp.interval_union([]) == 0
    assert dp.interval_union([(0, 2), (1, 3), (5, 6)]) == 4
    assert dp.interval_union([(5, 6), (0, 10)]) == 10


def _kernel(ts: float, dur: float, name: str) -> dict:
    return {"ph": "X", "cat": "kernel", "ts": ts, "dur": dur, "name": name}


def test_trace_summary_splits_a_step_into_kernel_classes_and_host_gaps() -> None:
    layers, steps, events, t = 2, 3, [], 0.0
    for _ in range(steps):
        for _ in range(layers):
            events.append(_kernel(t, 10, "sm90_xmma_gemm_qkv"))
            t += 10
            events.append(_kernel(t, 30, "flash::FlashAttnFwdSm90"))
            t += 30
            events.append(_kernel(t, 2, "flash::FlashAttnFwdCombine"))  # not a second attention call
            t += 2
        events.append(_kernel(t, 1, "flash::prepare_varlen_num_blocks_kernel"))  # once a step, not a layer
        t += 1
        events.append(_kernel(t, 5, "argmax_kernel"))
        t += 5 + 100  # the GPU waits 100 us for the host between steps
    events.append({"ph": "X", "cat": "cuda_runtime", "ts": 0, "dur": 7, "name": "cudaGraphLaunch"})
    events.append({"ph": "X", "cat": "user_annotation", "ts": 0, "dur": 50, "name": "execute_model"})
    summary = dp.summarize_trace({"traceEvents": events}, num_layers=layers)
    assert summary["steps"] == steps
    per_step_busy = layers * (10 + 30 + 2) + 1 + 5
    assert summary["gpu_busy_us_per_step"] == pytest.approx(per_step_busy)
    # the last step's trailing gap is outside the window
    assert summary["host_gap_us_per_step"] == pytest.approx(100 * (steps - 1) / steps)
    assert summary["classes"]["attention"]["us_per_step"] == pytest.approx(layers * 32 + 1)
    assert summary["classes"]["gemm"]["us_per_step"] == pytest.approx(layers * 10)
    assert summary["classes"]["sampling"]["count"] == steps
    assert summary["cuda_runtime"][0]["name"] == "cudaGraphLaunch"
    assert list(summary["classes"])[0] == "attention"  # largest first
    md = dp.render_profile_md(summary)
    assert "| attention |" in md and "host gaps" in md


def test_trace_without_kernels_says_so() -> None:
    summary = dp.summarize_trace({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 1, "name": "x"}]}, num_layers=28)
    assert "error" in summary
    assert "no GPU kernels" in dp.render_profile_md(summary)


# -- sweep order and deadline ----------------------------------------------------------------------


def test_sweep_order_is_by_expected_gain_and_names_override() -> None:
    order = pg.order_choices(None)
    assert "baseline" not in [c.name for c in order]
    gains = [c.prior_gain for c in order]
    assert gains == sorted(gains, reverse=True)
    assert order[0].name == "fp8-kv"
    assert [c.name for c in pg.order_choices(["triton-attn", "baseline", "fp8-kv"])] == ["triton-attn", "fp8-kv"]
    with pytest.raises(SystemExit):
        pg.order_choices(["no-such-choice"])
    assert [c.name for c in pg.order_choices(None, smoke=True)] == list(pg.SMOKE_SWEEP)


def test_every_choice_is_a_valid_engine_setting() -> None:
    from service.settings import EngineSettings

    for choice in pg.CHOICES:
        EngineSettings(**choice.engine)


def test_combining_winners() -> None:
    fp8, triton, splits = (pg.CHOICES_BY_NAME[n] for n in ("fp8-kv", "triton-attn", "fa-splits-128"))
    joint = pg.combine([fp8, triton])
    assert joint is not None and joint.engine == {"kv_cache_dtype": "fp8", "attention_backend": "TRITON_ATTN"}
    assert pg.combine([triton, splits]) is None  # two attention backends
    assert pg.combine([fp8]) is None
    assert pg.resolve_choice("fp8-kv+triton-attn").engine == joint.engine
    assert pg.resolve_choice("baseline").engine == {}
    for bad in ("triton-attn+fa-splits-128", "nope", "fp8-kv+nope"):
        with pytest.raises(SystemExit):
            pg.resolve_choice(bad)


def test_the_sweep_stops_when_the_program_would_not_fit() -> None:
    est = pg.Estimates()
    reserve = est.program_s(qualify=False)
    assert est.program_s(qualify=True) == pytest.approx(reserve + est.qualify_s)
    point = est.sweep_point_s()
    assert pg.fits(100.0, 100.0 + point + reserve, point, reserve)
    assert not pg.fits(100.0 + 1, 100.0 + point + reserve, point, reserve)


def test_native_estimate_follows_the_fit() -> None:
    assert pg.native_estimate_s(None, prompt_tokens=1, output_tokens=1, prefill_s=1) is None
    fit = {"a_s": 0.0018, "b_s_per_token": 2.6e-8}
    value = pg.native_estimate_s(fit, prompt_tokens=37_979, output_tokens=36_492, prefill_s=3.0)
    assert value is not None and 100 < value < 200  # the earlier runs' 120 s lies inside


def test_pick_best_needs_a_clear_gain() -> None:
    assert pg.pick_best({"baseline": 3.3e-3, "fp8-kv": 3.25e-3}) == "baseline"  # 1.5 %: noise
    assert pg.pick_best({"baseline": 3.3e-3, "fp8-kv": 3.0e-3, "triton-attn": 3.1e-3}) == "fp8-kv"
    assert pg.pick_best({"baseline": None, "triton-attn": 3.1e-3}) == "triton-attn"
    assert pg.pick_best({"baseline": 3.3e-3, "x": math.nan}) == "baseline"
    assert pg.pick_best({}) == "baseline"


@pytest.mark.parametrize("chunks", [1, 8, 9, 10, 11])
def test_chunk_budgets_sum_to_about_the_program(chunks: int) -> None:
    per = pg.chunk_budget(36_492, chunks)
    assert 36_492 <= per * chunks < 36_492 + chunks


# -- rows and transcript structure -----------------------------------------------------------------


def _body(segments: list[tuple[float, float, str]], *, chunks: int = 0) -> dict:
    return {
        "text": "x" * 10,
        "duration": 100.0,
        "segments": [{"start": s, "end": e, "speaker": sp, "text": "t"} for s, e, sp in segments],
        "moss": {
            "audio": {"duration_s": 100.0},
            "tokens": {"prompt": 1300, "generated": 500},
            "stop": {"stop": "max_tokens"},
            "coverage": {"coverage": 0.9},
            "truncated": True,
            "chunks": [
                {"stop": {"stop": "max_tokens"}, "tokens": {"prompt": 700, "generated": 250}, "start_s": 50.0 * i, "end_s": 50.0 * i + 55}
                for i in range(chunks)
            ],
            "timings": {"engine_decode_s": 1.0},
        },
    }


def test_structure_and_comparison() -> None:
    native = pg.transcript_structure(_body([(0, 10, "S01"), (5, 20, "S02"), (30, 40, "S01")]))
    assert native["segments"] == 3 and native["speakers"] == 2
    assert native["segment_time_covered_s"] == pytest.approx(30.0)
    assert native["segment_time_share"] == pytest.approx(0.3)
    assert native["stop"] == "max_tokens" and native["chunks"] is None
    chunked = pg.transcript_structure(_body([(0, 10, "S01"), (50, 90, "S03")], chunks=2))
    assert chunked["chunks"] == 2 and chunked["chunk_stops"] == ["max_tokens", "max_tokens"]
    assert chunked["chunk_generated"] == [250, 250] and chunked["chunk_spans_s"] == [(0.0, 55.0), (50.0, 105.0)]
    assert pg._prompt_tokens({"body": _body([], chunks=2)}) == 700
    assert pg._prompt_tokens({"body": _body([])}) == 1300
    diff = pg.compare_structures(native, chunked)
    assert diff["segments"] == {"native": 3, "chunked": 2, "chunked_minus_native": -1}
    assert diff["speakers"]["chunked_minus_native"] == 0
    assert "note" in pg.compare_structures(native, None)


def test_program_row_shape() -> None:
    curve = [{"context_tokens": 1000.0 + i * 100, "s_per_step": 0.002 + i * 1e-6, "steps": 128.0} for i in range(5)]
    ok = pg.program_row(
        pg.NATIVE_CELL, choice="baseline", response={"status": 200, "wall_s": 12.5, "body": _body([(0, 1, "S01")])},
        curve=curve, streams=1, audio_s=100.0, extra={"forced_tokens": 500},
    )
    for key in ("cell", "path", "wall_s", "generated_tokens", "prompt_tokens", "structure", "step_curve", "step_fit"):
        assert key in ok
    assert ok["cell"] == "program-2861.5s-c1" and ok["path"] == "gateway" and ok["wall_s"] == 12.5
    assert ok["rtf"] == pytest.approx(0.125) and ok["out_tok_s"] == pytest.approx(40.0)
    assert ok["forced_tokens"] == 500
    failed = pg.program_row(
        pg.CHUNKED_CELL, choice="baseline", response={"status": None, "timed_out": True, "wall_s": None},
        curve=[], streams=10, audio_s=100.0, extra={},
    )
    assert failed["wall_s"] is None and failed["timed_out"] and failed["structure"] is None and failed["step_fit"] is None
    assert failed["cell"] == "program-2861.5s-c1-chunked"


def test_plot_series_takes_probes_and_curves() -> None:
    result = {
        "probes": [
            {"choice": "baseline", "context_tokens": 38_000.0, "s_per_step": 0.0033},
            {"choice": "baseline", "context_tokens": 12_000.0, "s_per_step": 0.0025},
            {"choice": "baseline", "context_tokens": None, "s_per_step": None},
        ],
        "rows": [{"cell": pg.NATIVE_CELL, "choice": "fp8-kv", "streams": 1,
                  "step_curve": [{"context_tokens": 40_000.0, "s_per_step": 0.003}]}],
    }
    series = dp.plot_series(result)
    assert series["probe: baseline"] == [(12_000.0, 2.5), (38_000.0, 3.3)]
    assert list(series) == ["probe: baseline", f"{pg.NATIVE_CELL} (fp8-kv, 1 streams)"]


@pytest.mark.parametrize(
    ("chunking", "max_duration_s"),
    [({"target_s": 290.0, "max_concurrent_chunks": 16}, 3000.0), ({"target_s": 20.0, "overlap_s": 2.0, "search_s": 4.0, "max_chunk_s": 40.0}, None)],
)
def test_gateway_settings_carry_the_choice_and_a_valid_chunk_policy(tmp_path, chunking: dict, max_duration_s: float | None) -> None:
    from service.longform.policy import ChunkingPolicy

    spec = {
        "choice": {"name": "fp8-kv", "engine": {"kv_cache_dtype": "fp8"}},
        "base_engine": dict(pg.GPU_BASE_ENGINE) if max_duration_s else {},
        "model": str(tmp_path) if max_duration_s else None,
        "max_duration_s": max_duration_s,
        "chunking": chunking,
        "state_dir": str(tmp_path / "state"),
    }
    settings = pg.gateway_settings(spec, port=1234, token="t" * 32)
    assert settings.engine.kv_cache_dtype == "fp8"
    policy = ChunkingPolicy(**settings.chunking_defaults())
    assert policy.target_s == pytest.approx(chunking["target_s"])
    if max_duration_s:
        assert settings.engine.max_num_batched_tokens == 40960 and settings.max_duration_s == 3000.0
        assert settings.longform.max_concurrent_chunks >= math.ceil(pg.PROGRAM_DURATION_S / chunking["target_s"])


@pytest.mark.parametrize("margin", [None, 5.11])
def test_a_calibrated_near_tie_margin_reaches_the_qualification(tmp_path, margin: float | None) -> None:
    """The random full-size checkpoint qualifies only under its own calibrated margin (docs/benchmarks.md, run b)."""
    spec = {"choice": {"name": "baseline", "engine": {}}, "state_dir": str(tmp_path / "s"), "qualify": True,
            "near_tie_margin": margin}
    settings = pg.gateway_settings(spec, port=1, token="t" * 32)
    expected = margin if margin is not None else GatewaySettings().qualification.near_tie_logprob_margin
    assert settings.qualification.near_tie_logprob_margin == expected and settings.qualification.qualify_on_start


def test_fa3_main_kernel_counts_once_per_layer_despite_its_tile_scheduler() -> None:
    """The H200 run of 2026-11-30 printed "1 decode steps" for 100: FA3's name holds `TileScheduler`."""
    main = "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2>, flash::StaticPersistentTileScheduler<8>>>>(x)"
    combine = "void cutlass::device_kernel<flash::FlashAttnFwdCombine<cute::tuple<cute::C<8>>>>(x)"
    layers, steps = 4, 3
    events = []
    t = 0
    for _ in range(steps * layers):
        for name in (main, combine):
            events.append({"ph": "X", "cat": "kernel", "ts": t, "dur": 2, "name": name})
            t += 3
    summary = dp.summarize_trace({"traceEvents": events}, num_layers=layers)
    assert summary["steps"] == steps
