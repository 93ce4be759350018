"""Probes of a running gateway for the images: the HEALTHCHECK and the qualify job's wait.

Standard library only (the images carry no curl), so it runs with any Python 3.

  probe.py ready [--url URL]
      exit 0 when GET /ready answers 200 (engine loaded, healthy and the backend qualified),
      1 otherwise. The image's HEALTHCHECK: an unqualified gateway is reported unhealthy.
  probe.py wait-engine [--url URL] [--timeout S] [--interval S]
      wait until the engine has loaded (GET /ready reports "engine": "ready", qualified or not),
      the point from which POST /admin/qualify is accepted. Exit 0 then, 1 on timeout, 2 if
      the engine failed, died or is stopping.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000"
#: service.state.EngineStatus values from which the engine will not become ready by itself.
FAILED_STATES = ("failed", "dead", "stopping")


def get_ready(url: str, timeout: float) -> tuple[int | None, dict]:
    """Status and body of GET {url}/ready; (None, {}) when nothing answers."""
    request = urllib.request.Request(url.rstrip("/") + "/ready", headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (OSError, ValueError):
        return None, {}
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = {}
    return status, body if isinstance(body, dict) else {}


def ready(args: argparse.Namespace) -> int:
    status, body = get_ready(args.url, args.request_timeout)
    if status == 200 and body.get("ready") is True:
        return 0
    reasons = "; ".join(body.get("reasons") or []) or ("no answer" if status is None else f"HTTP {status}")
    print(f"not ready: {reasons}", file=sys.stderr)
    return 1


def wait_engine(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    last = None
    while True:
        status, body = get_ready(args.url, args.request_timeout)
        engine = body.get("engine")
        if engine == "ready":
            print(f"engine ready at {args.url} (qualified: {body.get('qualified')})", file=sys.stderr)
            return 0
        if engine in FAILED_STATES:
            print(f"engine {engine}: {'; '.join(body.get('reasons') or [])}", file=sys.stderr)
            return 2
        state = engine or ("no answer" if status is None else f"HTTP {status}")
        if state != last:
            print(f"waiting for the engine at {args.url}: {state}", file=sys.stderr)
            last = state
        if time.monotonic() >= deadline:
            print(f"timed out after {args.timeout:g} s waiting for the engine", file=sys.stderr)
            return 1
        time.sleep(args.interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="probe.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (("ready", ready), ("wait-engine", wait_engine)):
        p = sub.add_parser(name)
        p.add_argument("--url", default=DEFAULT_URL)
        p.add_argument("--request-timeout", type=float, default=5.0)
        p.set_defaults(func=func)
        if name == "wait-engine":
            p.add_argument("--timeout", type=float, default=3600.0)
            p.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
