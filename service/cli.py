"""`moss-gateway`: serve, qualify, transcribe, evaluate, build the tiny checkpoint.

Every setting comes from the one settings model (environment, `MOSS_GATEWAY_`
prefix); the flags here override the few an operator types most often.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from service import transcribe_cli
from service.app import admission_controller, create_app, model_name, vllm_engine_factory
from service.checkpoint import ensure_tiny_checkpoint
from service.evaluation.arguments import add_evaluate_arguments
from service.evaluation.command import evaluate_command
from service.frontends import serve_frontends
from service.gate import record_summary, resolve_backend_identity, run_qualification
from service.ledger import JsonLinesLedger
from service.metrics import GatewayMetrics
from service.server import configure_logging, run_server
from service.settings import GatewaySettings
from service.state import EngineStatus, GatewayState


def _settings(args: argparse.Namespace) -> GatewaySettings:
    overrides: dict[str, Any] = {}
    server: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    if getattr(args, "host", None):
        server["host"] = args.host
    if getattr(args, "port", None) is not None:
        server["port"] = args.port
    if getattr(args, "api_processes", None) is not None:
        server["api_processes"] = args.api_processes
    if getattr(args, "admin_token", None) and not getattr(args, "url", None):
        server["admin_token"] = args.admin_token
    if getattr(args, "model", None):
        engine["model"] = args.model
    if getattr(args, "state_dir", None):
        overrides["state_dir"] = Path(args.state_dir)
    if getattr(args, "qualify_on_start", None) is not None:
        overrides["qualification"] = {"qualify_on_start": args.qualify_on_start}
    if server:
        overrides["server"] = server
    if engine:
        overrides["engine"] = engine
    return GatewaySettings(**overrides)


def serve(args: argparse.Namespace) -> int:

    settings = _settings(args)
    configure_logging(settings.server.log_level)
    if settings.server.api_processes > 1:
        return serve_frontends(settings)  # several front-end processes on one engine core: service/frontends.py
    # Header size and deadline, keep-alive, connection limit, signals: see service/server.py.
    return run_server(create_app(settings), settings)


def _print_summary(summary: dict[str, Any]) -> None:
    print(json.dumps(summary, indent=2, ensure_ascii=False, default=str))


def qualify_remote(args: argparse.Namespace) -> int:
    """Ask a running gateway to qualify itself, and follow its progress."""
    import httpx

    headers = {"Authorization": f"Bearer {args.admin_token}"} if args.admin_token else {}
    files = None
    if args.clip:
        files = {"clip": (Path(args.clip).name, Path(args.clip).read_bytes(), "application/octet-stream")}
    with httpx.Client(base_url=args.url, headers=headers, timeout=60) as client:
        response = client.post("/admin/qualify", files=files)
        if response.status_code not in (202, 409):
            print(f"qualify: {response.status_code} {response.text}", file=sys.stderr)
            return 2
        deadline = time.monotonic() + args.timeout
        last_progress = None
        status: dict[str, Any] = response.json()
        while time.monotonic() < deadline:
            status = client.get("/admin/qualify").json()
            if status.get("progress") != last_progress:
                last_progress = status.get("progress")
                print(f"qualify: {last_progress}", file=sys.stderr)
            if not status.get("running"):
                break
            time.sleep(1.0)
        else:
            print("qualify: timed out waiting for the gateway", file=sys.stderr)
            return 3
    _print_summary(status.get("last") or status)
    return 0 if status.get("gate_open") else 1


async def _qualify_standalone(settings: GatewaySettings, clip: Path | None) -> int:

    metrics = GatewayMetrics()
    state = GatewayState(
        settings=settings,
        model_name=model_name(settings),
        metrics=metrics,
        request_ledger=JsonLinesLedger(settings.state_dir / "ledger" / "requests.jsonl"),
        admission=admission_controller(settings, metrics),
    )
    engine = vllm_engine_factory(settings)
    await asyncio.to_thread(engine.start)
    state.engine, state.engine_status = engine, EngineStatus.READY
    try:
        await resolve_backend_identity(state)
        record = await run_qualification(state, clip=clip)
    finally:
        await engine.shutdown()

    _print_summary(record_summary(record))
    return 0 if state.gate.open else 1


def qualify(args: argparse.Namespace) -> int:
    if args.url and not args.standalone:
        return qualify_remote(args)
    # stdout carries only the summary JSON; vLLM logs to stdout unless told otherwise.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    settings = _settings(args)
    configure_logging(settings.server.log_level)
    return asyncio.run(_qualify_standalone(settings, Path(args.clip) if args.clip else None))


def build_tiny(args: argparse.Namespace) -> int:

    print(ensure_tiny_checkpoint(Path(args.cache_dir) if args.cache_dir else None))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moss-gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p_serve = sub.add_parser("serve", help="Start the gateway.")
    p_serve.add_argument("--host")
    p_serve.add_argument("--port", type=int)
    p_serve.add_argument("--model", help="Checkpoint directory or repo id (default: the embedded tiny checkpoint).")
    p_serve.add_argument("--state-dir")
    p_serve.add_argument("--admin-token")
    p_serve.add_argument(
        "--api-processes", type=int,
        help="HTTP front-end processes on one engine core (server.api_processes; default 1).",
    )
    p_serve.add_argument(
        "--qualify-on-start", action=argparse.BooleanOptionalAction, default=None,
        help="Qualify the backend at start-up (default: only for the embedded tiny checkpoint).",
    )
    p_serve.set_defaults(func=serve)

    p_qualify = sub.add_parser("qualify", help="Qualify the serving backend against the Transformers reference.")
    p_qualify.add_argument("--url", help="A running gateway to qualify (through its admin endpoint).")
    p_qualify.add_argument("--admin-token", help="The gateway's admin token (or MOSS_GATEWAY_SERVER__ADMIN_TOKEN).")
    p_qualify.add_argument("--clip", help="Your own clip (default: the frozen 10 s two-voice clip).")
    p_qualify.add_argument("--standalone", action="store_true", help="Start the engine here instead of using --url.")
    p_qualify.add_argument("--model")
    p_qualify.add_argument("--state-dir")
    p_qualify.add_argument("--timeout", type=float, default=3600.0)
    p_qualify.set_defaults(func=qualify)

    p_transcribe = sub.add_parser("transcribe", help="Transcribe files through a gateway (or a standalone one).")
    transcribe_cli.add_arguments(p_transcribe)
    p_transcribe.set_defaults(func=transcribe_cli.main)

    p_tiny = sub.add_parser("build-tiny-checkpoint", help="Build (or find) the embedded tiny checkpoint.")
    p_tiny.add_argument("--cache-dir")
    p_tiny.set_defaults(func=build_tiny)

    p_evaluate = sub.add_parser("evaluate", help="Score a running gateway against gold, per track; or compare two reports.")
    add_evaluate_arguments(p_evaluate)
    p_evaluate.set_defaults(func=evaluate_command)

    args = parser.parse_args(argv)
    if args.command == "qualify" and not args.admin_token:
        token = GatewaySettings().server.admin_token
        args.admin_token = token.get_secret_value() if token else None
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
