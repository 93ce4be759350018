"""The `moss-gateway evaluate` flags (the command itself is `command.py`)."""

from __future__ import annotations

import argparse

from service.evaluation.protocol import Protocol

DEFAULTS = Protocol()


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", nargs="?", help="JSON Lines manifest (id, audio, gold; see docs/evaluation.md).")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="The gateway to evaluate (default: %(default)s).")
    parser.add_argument("--api-key", help="Bearer key for /v1 when the gateway requires one.")
    parser.add_argument("--track", choices=("native", "chunked", "both"), default="both",
                        help="native: no chunking_strategy; chunked: server_vad (forced chunks); both: each, reported apart.")
    parser.add_argument("--out", default="evaluation", help="Folder for report.json, report.md and plots (default: %(default)s).")
    parser.add_argument("--collar", type=float, default=DEFAULTS.collar_s, help="DER/JER collar in seconds (default: %(default)s).")
    parser.add_argument("--window-s", type=float, default=DEFAULTS.window_s,
                        help="Gold window length where the manifest gives no cuts (default: %(default)s).")
    parser.add_argument("--bin-s", type=float, default=DEFAULTS.bin_s, help="Coverage-over-time bin (default: %(default)s).")
    parser.add_argument("--bootstrap-samples", type=int, default=DEFAULTS.bootstrap_samples)
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed, help="Bootstrap seed (default: %(default)s).")
    parser.add_argument("--max-completion-tokens", type=int,
                        help="Output budget per request (default: the gateway's own, 20 tokens per audio second).")
    parser.add_argument("--timeout", type=float, default=3600.0, help="Seconds to wait for one transcription.")
    parser.add_argument("--no-plots", action="store_true", help="Skip the PNG plots.")
    parser.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                        help="Compare two reports instead of running a manifest.")
    parser.add_argument("--tracks", metavar="A:B",
                        help="With --compare: the track of A and of B (e.g. native:chunked); default: each common track.")
