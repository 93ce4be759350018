"""``python -m service.checkpoint build --out DIR`` / ``python -m service.checkpoint ensure``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from service.checkpoint import checkpoint_key, ensure_tiny_checkpoint
from service.checkpoint.build import build_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.checkpoint", description="tiny MOSS checkpoint")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build into DIR (must be empty or absent)")
    b.add_argument("--out", type=Path, required=True)
    e = sub.add_parser("ensure", help="build into the cache if needed; print the folder")
    e.add_argument("--cache-dir", type=Path, default=None)
    sub.add_parser("key", help="print the content hash")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)

    if args.command == "build":
        report = build_checkpoint(args.out)
        print(json.dumps(report, indent=2))
    elif args.command == "ensure":
        print(ensure_tiny_checkpoint(args.cache_dir))
    else:
        print(checkpoint_key())
    return 0


if __name__ == "__main__":
    sys.exit(main())
