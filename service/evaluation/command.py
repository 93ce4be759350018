"""`moss-gateway evaluate`: run a manifest and write the report, or compare two reports.

Exit codes: 0 report written (whatever the scores), 1 every request failed on
some track (nothing was scored, e.g. the gateway is not qualified), 2 the inputs
or the protocol are at fault (`EvaluationError`, printed).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from service.evaluation import compare, plots, report
from service.evaluation.client import GatewayClient
from service.evaluation.errors import EvaluationError
from service.evaluation.manifest import read_manifest
from service.evaluation.protocol import Protocol
from service.evaluation.runner import run

logger = logging.getLogger(__name__)


def _progress(message: str) -> None:
    print(f"evaluate: {message}", file=sys.stderr, flush=True)


def run_manifest(args: argparse.Namespace) -> int:
    manifest = Path(args.manifest)
    items = read_manifest(manifest)
    tracks = ("native", "chunked") if args.track == "both" else (args.track,)
    protocol = Protocol(
        collar_s=args.collar, window_s=args.window_s, bin_s=args.bin_s, bootstrap_samples=args.bootstrap_samples,
        seed=args.seed, max_completion_tokens=args.max_completion_tokens,
    )
    with GatewayClient(args.url, api_key=args.api_key, timeout_s=args.timeout,
                       max_completion_tokens=args.max_completion_tokens) as client:
        result = run(items, tracks, client, protocol, progress=_progress)
    built = report.build(result, protocol, url=args.url, manifest=manifest, tracks=tracks)
    out = Path(args.out)
    json_path, md_path = report.write(built, out)
    written = [json_path, md_path] + ([] if args.no_plots else plots.write_plots(built, out))
    for path in written:
        _progress(f"wrote {path}")
    summary = {track: {m: section["overall"][m] for m in ("cer", "wer", "cpcer", "der", "jer", "success")}
               for track, section in built["tracks"].items()}
    print(json.dumps(summary, indent=2))
    nothing_scored = any(section["overall"]["failed"] == section["overall"]["units"] for section in built["tracks"].values())
    return 1 if nothing_scored or not built["tracks"] else 0


def run_compare(args: argparse.Namespace) -> int:
    path_a, path_b = (Path(p) for p in args.compare)
    a, b = report.load(path_a), report.load(path_b)
    if args.tracks:
        track_a, _, track_b = args.tracks.partition(":")
        pairs = [(track_a, track_b or track_a)]
    else:
        pairs = [(t, t) for t in a["tracks"] if t in b["tracks"]]
        if not pairs:
            raise EvaluationError("the reports share no track; name the pair with --tracks A:B")
    results = [compare.compare(a, b, ta, tb) for ta, tb in pairs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    text = "\n".join(compare.markdown(r) for r in results)
    (out / "compare.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


def evaluate_command(args: argparse.Namespace) -> int:
    try:
        if args.compare:
            return run_compare(args)
        if not args.manifest:
            raise EvaluationError("give a MANIFEST to run, or --compare A.json B.json")
        return run_manifest(args)
    except EvaluationError as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return 2
