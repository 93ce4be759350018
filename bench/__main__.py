"""``python -m bench``: the GPU benchmark of the gateway, the direct engine and the reference.

    python -m bench run --workload short,long --model DIR --out results/short-long.json [engine options]
    python -m bench run --workload program    --model DIR --out results/program.json
    python -m bench run --workload reference  --model DIR --out results/reference.json
    python -m bench checkpoint --out DIR --device cuda      # the full-size random checkpoint
    python -m bench report results/*.json [--markdown]
    python -m bench throughput --model DIR --out results/short.json --repeats 3 [engine options]
    python -m bench report --plots [results/*.json]   # figures into docs/ (default: every bench/results/*/ row)

Each ``run`` prints the table and writes JSON (rows, per-request records, the
backend identity, the qualification). Workloads: ``short`` (12 s clips at
concurrency 1, 4, 16, 64), ``long`` (300 s and 600 s clips at 1 and 8),
``program`` (the 2861.5 s program at 1), ``reference`` (Transformers, 12 s and
300 s). ``--smoke`` shrinks every cell for a CPU run on the tiny checkpoint.
``throughput`` is the interleaved protocol of issue 13 (``bench.protocol``,
``bench.throughput``): direct, gateway and ``vllm serve`` in every repetition.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

from bench import report
from bench.workloads import ENGINE_WORKLOADS, Cell, cells_for

try:
    from bench import plots
except ModuleNotFoundError:  # matplotlib: installed by scripts/bootstrap, absent from the GPU hosts' bundle
    plots = None

#: Where `report` looks when given no files, and where `--plots` draws by default.
RESULTS_DIR = Path(__file__).resolve().parent / "results"
DOCS_DIR = Path(__file__).resolve().parents[1] / "docs"


def _workloads(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run workloads, print the table, write JSON")
    p.add_argument(
        "--workload", type=_workloads, required=True, help="comma-separated: short, long, program, reference"
    )
    p.add_argument(
        "--cells", type=_workloads, default=None, help="comma-separated cell names: run only these, in this order"
    )
    p.add_argument(
        "--add-path",
        action="append",
        default=[],
        choices=("direct-final",),
        help="an extra path for the cells that have 'direct': direct-final = the adapter with final-only output "
        "(stream_deltas=False, what the gateway asks for unstreamed short passes)",
    )
    p.add_argument("--add-path-min-concurrency", type=int, default=1, help="add --add-path only from this concurrency")
    _add_engine_options(p)


def _add_throughput(sub: argparse._SubParsersAction) -> None:
    from bench.protocol import MIN_REPEATS, PATHS
    from bench.workloads import PROTOCOL_CELL_NAMES

    p = sub.add_parser(
        "throughput",
        help="the interleaved protocol (issue 13): every path of a cell in every repetition, order rotated",
    )
    p.add_argument(
        "--cells",
        type=_workloads,
        default=list(PROTOCOL_CELL_NAMES),
        help=f"comma-separated, in this order (default: {','.join(PROTOCOL_CELL_NAMES)})",
    )
    p.add_argument("--repeats", type=int, default=MIN_REPEATS, help=f"repetitions per cell (at least {MIN_REPEATS})")
    p.add_argument("--paths", type=_workloads, default=list(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    p.add_argument(
        "--api-server-count", type=int, default=None, help="vllm serve --api-server-count (unset: its default, 1)"
    )
    p.add_argument("--serve-log", type=Path, default=None, help="vllm serve's log (default: next to --out)")
    p.add_argument(
        "--api-processes", type=int, default=4, help="front-end processes of the gateway-mp path (server.api_processes)"
    )
    _add_engine_options(p)
    p.set_defaults(workload=["protocol"])


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, default=None, help="checkpoint folder (unset: the embedded tiny checkpoint)")
    p.add_argument(
        "--build-checkpoint", action="store_true", help="build the full-size random checkpoint into --model first"
    )
    p.add_argument("--checkpoint-device", default="cuda")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--smoke", action="store_true", help="CPU-sized cells (tiny checkpoint)")
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--deadline-s", type=float, default=540.0, help="skip cells that cannot finish before this")
    p.add_argument("--start-timeout-s", type=float, default=420.0)
    p.add_argument("--work-dir", default=None, help="where the WAV files are written (default: the temp dir)")
    p.add_argument(
        "--paced-engine-ms",
        type=float,
        default=None,
        help="CPU study: a stand-in engine giving every request one token per step of this many ms",
    )
    p.add_argument("--profile", default=None, help="write a cProfile of the event loop during the gateway blocks here")
    # the engine (all part of the backend identity)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-duration-s", type=float, default=None, help="the gateway's longest accepted audio")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"))
    p.add_argument("--kv-cache-dtype", default="auto", help="auto, or fp8 (changes the identity)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (default: graphs on)")
    # the gateway's admission control (not part of the identity): unset keeps the gateway's default (16)
    p.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=None,
        help="limits.max_concurrent_requests (admission slots); set it to the highest concurrency measured, "
        "or the gateway's 16 slots cap the concurrency-64 cell",
    )
    # the gate
    p.add_argument("--state-dir", default="state/bench")
    p.add_argument("--cache-dir", default=None)
    p.add_argument(
        "--qualify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="qualify at start-up when no passing record exists (default on)",
    )
    p.add_argument(
        "--allow-unqualified",
        action="store_true",
        help="if the gate stays closed, open it for the benchmark only as 'bench-unqualified'",
    )
    p.add_argument("--reference-device", default="cuda")
    p.add_argument("--reference-dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))


def select_cells(
    cells: list[Cell], names: list[str] | None, add_paths: list[str], min_concurrency: int = 1
) -> list[Cell]:
    """Only the named cells (in the given order), with extra paths where the cell has 'direct'."""
    if names:
        by_name = {c.name: c for c in cells}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise SystemExit(f"unknown cell(s) {', '.join(unknown)}; the workloads have {', '.join(by_name)}")
        cells = [by_name[n] for n in names]
    out = []
    for cell in cells:
        extra = tuple(
            p
            for p in add_paths
            if p not in cell.paths and "direct" in cell.paths and cell.concurrency >= min_concurrency
        )
        out.append(replace(cell, paths=cell.paths + extra) if extra else cell)
    return out


def _report(args: argparse.Namespace) -> int:
    files = args.files or sorted(RESULTS_DIR.glob("*/*.json"))
    results = report.load(files)
    print(report.render(results, markdown=args.markdown))
    if args.plots:
        if plots is None:
            print("--plots needs matplotlib (scripts/bootstrap installs it)", file=sys.stderr)
            return 2
        for path in plots.draw(list(zip(files, results, strict=True)), args.plots_dir):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_throughput(sub)
    c = sub.add_parser("checkpoint", help="build the full-size random-weight checkpoint")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--device", default="cuda")
    c.add_argument("--text-layers", type=int, default=None)
    c.add_argument("--audio-layers", type=int, default=None)
    c.add_argument("--dtype", default="bfloat16")
    r = sub.add_parser("report", help="print the table of result files (default: bench/results/*/*.json)")
    r.add_argument("files", type=Path, nargs="*")
    r.add_argument("--markdown", action="store_true")
    r.add_argument("--plots", action="store_true", help="also draw the figures (matplotlib) into --plots-dir")
    r.add_argument("--plots-dir", type=Path, default=DOCS_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if args.command == "checkpoint":
        from bench.checkpoint import ensure_fullsize_checkpoint

        ensure_fullsize_checkpoint(
            args.out, device=args.device, dtype=args.dtype, text_layers=args.text_layers, audio_layers=args.audio_layers
        )
        return 0
    if args.command == "report":
        return _report(args)
    if args.command == "throughput":
        return throughput(args)
    return run(args)


def throughput(args: argparse.Namespace) -> int:
    from bench.protocol import EXTRA_PATHS, MIN_REPEATS, PATHS
    from bench.throughput import run_throughput
    from bench.workloads import protocol_cells

    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.repeats < MIN_REPEATS:
        raise SystemExit(f"--repeats must be at least {MIN_REPEATS}")
    unknown = [p for p in args.paths if p not in PATHS + EXTRA_PATHS]
    if unknown:
        raise SystemExit(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS + EXTRA_PATHS)}")
    if args.build_checkpoint:
        if args.model is None:
            raise SystemExit("--build-checkpoint needs --model DIR")
        from bench.checkpoint import ensure_fullsize_checkpoint

        ensure_fullsize_checkpoint(args.model, device=args.checkpoint_device)
    cells = protocol_cells(args.cells, paths=tuple(args.paths), smoke=args.smoke)
    result = run_throughput(args, cells, args.out)
    print("\n" + report.render([result]), flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.build_checkpoint:
        if args.model is None:
            raise SystemExit("--build-checkpoint needs --model DIR")
        from bench.checkpoint import ensure_fullsize_checkpoint

        ensure_fullsize_checkpoint(args.model, device=args.checkpoint_device)
    cells = select_cells(
        cells_for(args.workload, smoke=args.smoke), args.cells, args.add_path, args.add_path_min_concurrency
    )
    engine_cells = [c for c in cells if c.workload in ENGINE_WORKLOADS]
    reference_cells = [c for c in cells if c.workload == "reference"]
    results = []
    if engine_cells:
        from bench.harness import run_engine_bench

        out = args.out if not reference_cells else args.out.with_name(args.out.stem + "-engine.json")
        results.append(run_engine_bench(args, engine_cells, out))
    if reference_cells:
        from bench.reference import run_reference_bench

        model_dir = args.model
        if model_dir is None:
            from service.checkpoint import ensure_tiny_checkpoint

            model_dir = ensure_tiny_checkpoint(Path(args.cache_dir) if args.cache_dir else None)
        out = args.out if not engine_cells else args.out.with_name(args.out.stem + "-reference.json")
        results.append(run_reference_bench(args, reference_cells, out, Path(model_dir)))
    print("\n" + report.render(results), flush=True)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's background threads can hold the interpreter after the results are written
    os._exit(code)
