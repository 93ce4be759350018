"""Bounded load test of a running gateway: throughput, latency, errors and memory.

    python tools/loadtest.py --url http://127.0.0.1:8000 --concurrency 8 --requests 200 \\
        --time-limit 120 --duration-s 10 --pid "$(pgrep -f 'moss-gateway serve' | head -1)" \\
        --json-out load.json

Every run is bounded three ways: at most `--requests` requests, at most
`--concurrency` at a time, and a wall-clock cap `--time-limit` after which
nothing new is sent and what is still in flight is cancelled (and counted).
It sends its own audio (a tone with a little noise, `--duration-s` long) or
`--file`. It refuses a non-loopback URL unless `--allow-remote` is given.

Reported: requests/s and audio-seconds/s over the run's wall time, latency
percentiles (p50/p90/p99, of successful requests and of all answered ones),
time to first event when streaming, counts by outcome (`200`, `400/invalid_audio`,
`429/...`, `transport/ConnectError`, `cancelled`), the stop classes the
gateway reported (X-Moss-Stop), and with `--pid` the gateway's memory: RSS of
the process and its children sampled every `--sample-interval` seconds (peak,
start, end) plus the kernel's own high-water mark (VmHWM) of the main process.
Exit status: 0 when every request got a non-5xx HTTP answer, 1 otherwise, 2 on
bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import ipaddress
import json
import math
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

ENDPOINT = "/v1/audio/transcriptions"
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


# -- inputs -------------------------------------------------------------------------------


def make_audio(duration_s: float, rate: int = 16_000, seed: int = 0) -> bytes:
    """A deterministic 16-bit mono WAV: a 220 Hz tone plus a little noise."""
    import soundfile as sf

    rng = np.random.default_rng(seed)
    t = np.arange(int(duration_s * rate)) / rate
    samples = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.01 * rng.standard_normal(t.size)
    buffer = io.BytesIO()
    sf.write(buffer, samples.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def audio_duration(data: bytes) -> float | None:
    """Duration of an audio file, when libsndfile or FFmpeg can tell; None otherwise."""
    try:
        import soundfile as sf

        info = sf.info(io.BytesIO(data))
        return float(info.frames) / float(info.samplerate)
    except Exception:
        pass
    try:
        import av

        with av.open(io.BytesIO(data)) as container:
            if container.duration:
                return float(container.duration) / 1_000_000
    except Exception:
        pass
    return None


def is_loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- memory ---------------------------------------------------------------------------------


@dataclass
class MemoryReport:
    pid: int
    samples: int = 0
    start_rss_bytes: int | None = None
    peak_rss_bytes: int | None = None
    end_rss_bytes: int | None = None
    vm_hwm_bytes: int | None = None  # the kernel's peak RSS of the main process (Linux)
    includes_children: bool = True
    error: str | None = None


class MemorySampler:
    """Samples the RSS of a process (and its children) in a thread; keeps the high-water mark."""

    def __init__(self, pid: int, interval_s: float = 0.05, include_children: bool = True) -> None:
        import psutil

        self.process = psutil.Process(pid)
        self.interval_s = interval_s
        self.report = MemoryReport(pid=pid, includes_children=include_children)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _rss(self) -> int:
        import psutil

        total = self.process.memory_info().rss
        if self.report.includes_children:
            for child in self.process.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
        return total

    def sample(self) -> int | None:
        try:
            rss = self._rss()
        except Exception as exc:  # the process went away, or we may not look at it
            self.report.error = f"{type(exc).__name__}: {exc}"
            return None
        report = self.report
        report.samples += 1
        if report.start_rss_bytes is None:
            report.start_rss_bytes = rss
        report.peak_rss_bytes = max(report.peak_rss_bytes or 0, rss)
        report.end_rss_bytes = rss
        return rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()
        self.report.vm_hwm_bytes = vm_hwm(self.report.pid)


def vm_hwm(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# -- running ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    index: int
    outcome: str  # "200", "400/invalid_audio", "transport/ConnectError", "cancelled"
    status: int | None
    latency_s: float | None
    first_event_s: float | None = None
    stop: str | None = None
    truncated: bool | None = None
    audio_s: float | None = None


@dataclass
class LoadConfig:
    url: str
    concurrency: int = 8
    requests: int = 40
    time_limit_s: float = 60.0
    request_timeout_s: float = 600.0
    response_format: str = "json"
    stream: bool = False
    fields: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    filename: str = "loadtest.wav"


async def _one(client: httpx.AsyncClient, config: LoadConfig, audio: bytes, index: int) -> Outcome:
    form = {"response_format": config.response_format, **config.fields}
    if config.stream:
        form["stream"] = "true"
    files = {"file": (config.filename, audio, "application/octet-stream")}
    started = time.perf_counter()
    try:
        if config.stream:
            return await _one_stream(client, config, form, files, index, started)
        response = await client.post(ENDPOINT, data=form, files=files, headers=config.headers)
    except httpx.TimeoutException as exc:
        return Outcome(index, f"transport/{type(exc).__name__}", None, time.perf_counter() - started)
    except httpx.HTTPError as exc:
        return Outcome(index, f"transport/{type(exc).__name__}", None, time.perf_counter() - started)
    latency = time.perf_counter() - started
    return Outcome(
        index,
        _classify(response.status_code, response.headers, response.content),
        response.status_code,
        latency,
        stop=response.headers.get("x-moss-stop"),
        truncated=_truthy(response.headers.get("x-moss-truncated")),
    )


async def _one_stream(
    client: httpx.AsyncClient, config: LoadConfig, form: dict[str, str], files: Any, index: int, started: float
) -> Outcome:
    first_event: float | None = None
    stop: str | None = None
    truncated: bool | None = None
    outcome: str | None = None
    async with client.stream("POST", ENDPOINT, data=form, files=files, headers=config.headers) as response:
        if response.status_code != 200:
            content = await response.aread()
            return Outcome(
                index,
                _classify(response.status_code, response.headers, content),
                response.status_code,
                time.perf_counter() - started,
            )
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            if first_event is None:
                first_event = time.perf_counter() - started
            try:
                event = json.loads(line[5:])
            except ValueError:
                outcome = "stream/bad_event"
                continue
            if event.get("type") == "error":
                outcome = f"stream_error/{(event.get('error') or {}).get('code', 'unknown')}"
            elif event.get("type") == "transcript.text.done":
                moss = event.get("moss") or {}
                stop = (moss.get("stop") or {}).get("stop")
                truncated = moss.get("truncated")
    if outcome is None and stop is None:
        outcome = "stream/no_done_event"
    return Outcome(index, outcome or "200", 200, time.perf_counter() - started, first_event, stop, truncated)


def _classify(status: int, headers: httpx.Headers, content: bytes) -> str:
    if status == 200:
        return "200"
    code = headers.get("x-error-code")
    if not code:
        try:
            code = json.loads(content)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = "no_envelope"
    return f"{status}/{code}"


def _truthy(value: str | None) -> bool | None:
    return None if value is None else value.strip().lower() == "true"


async def run_load(config: LoadConfig, audio: bytes, audio_s: float | None) -> tuple[list[Outcome], float]:
    """Send the requests; returns the outcomes (one per request started or skipped) and the wall time."""
    outcomes: list[Outcome] = []
    next_index = 0
    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)
    timeout = httpx.Timeout(config.request_timeout_s, connect=min(10.0, config.request_timeout_s))
    started = time.perf_counter()
    deadline = started + config.time_limit_s
    in_flight: dict[int, float] = {}

    async with httpx.AsyncClient(base_url=config.url, limits=limits, timeout=timeout, trust_env=False) as client:

        async def worker() -> None:
            nonlocal next_index
            while next_index < config.requests and time.perf_counter() < deadline:
                index = next_index
                next_index += 1
                in_flight[index] = time.perf_counter()
                outcome = await _one(client, config, audio, index)
                in_flight.pop(index, None)
                if outcome.status == 200 and outcome.outcome == "200":
                    outcome.audio_s = audio_s
                outcomes.append(outcome)

        workers = [asyncio.create_task(worker()) for _ in range(config.concurrency)]
        try:
            async with asyncio.timeout(max(config.time_limit_s, 0.001)):
                await asyncio.gather(*workers)
        except TimeoutError:
            pass
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        now = time.perf_counter()
        for index, since in sorted(in_flight.items()):
            outcomes.append(Outcome(index, "cancelled", None, now - since))
    wall = time.perf_counter() - started
    not_sent = config.requests - next_index
    outcomes.extend(Outcome(-1, "not_sent", None, None) for _ in range(not_sent))
    return outcomes, wall


# -- reporting ------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _latency(values: list[float]) -> dict[str, float | None]:
    return {
        "count": len(values),
        "mean_s": sum(values) / len(values) if values else None,
        "min_s": min(values) if values else None,
        "p50_s": percentile(values, 50),
        "p90_s": percentile(values, 90),
        "p99_s": percentile(values, 99),
        "max_s": max(values) if values else None,
    }


def summarize(
    config: LoadConfig, outcomes: list[Outcome], wall_s: float, audio_s: float | None, memory: MemoryReport | None
) -> dict[str, Any]:
    ok = [o for o in outcomes if o.outcome == "200"]
    answered = [o for o in outcomes if o.status is not None]
    by_outcome: dict[str, int] = {}
    for outcome in outcomes:
        by_outcome[outcome.outcome] = by_outcome.get(outcome.outcome, 0) + 1
    stops: dict[str, int] = {}
    for outcome in ok:
        if outcome.stop:
            stops[outcome.stop] = stops.get(outcome.stop, 0) + 1
    server_errors = sum(1 for o in answered if o.status is not None and o.status >= 500)
    server_errors += sum(1 for o in outcomes if o.outcome.startswith("stream_error/engine"))
    transport_errors = sum(1 for o in outcomes if o.outcome.startswith("transport/"))
    ok_audio = sum(o.audio_s or 0.0 for o in ok)
    return {
        "config": {
            "url": config.url,
            "concurrency": config.concurrency,
            "requests": config.requests,
            "time_limit_s": config.time_limit_s,
            "response_format": config.response_format,
            "stream": config.stream,
            "audio_s_per_request": audio_s,
        },
        "wall_s": wall_s,
        "sent": sum(1 for o in outcomes if o.outcome != "not_sent"),
        "answered": len(answered),
        "ok": len(ok),
        "server_errors": server_errors,
        "transport_errors": transport_errors,
        "cancelled": by_outcome.get("cancelled", 0),
        "not_sent": by_outcome.get("not_sent", 0),
        "by_outcome": dict(sorted(by_outcome.items())),
        "stops": dict(sorted(stops.items())),
        "truncated": sum(1 for o in ok if o.truncated),
        "throughput": {
            "requests_per_s": len(ok) / wall_s if wall_s > 0 else None,
            "answered_per_s": len(answered) / wall_s if wall_s > 0 else None,
            "audio_s_per_s": ok_audio / wall_s if wall_s > 0 and audio_s else None,
            "audio_s_total": ok_audio if audio_s else None,
        },
        "latency_ok": _latency([o.latency_s for o in ok if o.latency_s is not None]),
        "latency_all_answered": _latency([o.latency_s for o in answered if o.latency_s is not None]),
        "first_event": _latency([o.first_event_s for o in ok if o.first_event_s is not None])
        if config.stream
        else None,
        "memory": asdict(memory) if memory is not None else None,
    }


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms" if value < 1 else f"{value:.3f} s"


def _fmt_bytes(value: int | None) -> str:
    return "-" if value is None else f"{value / (1 << 20):.1f} MiB"


def render_table(report: dict[str, Any]) -> str:
    config, throughput = report["config"], report["throughput"]
    rows: list[tuple[str, str]] = [
        ("target", f"{config['url']}{ENDPOINT}"),
        (
            "load",
            f"{config['requests']} requests, {config['concurrency']} concurrent, cap {config['time_limit_s']:g} s",
        ),
        (
            "audio per request",
            "-" if config["audio_s_per_request"] is None else f"{config['audio_s_per_request']:.2f} s",
        ),
        ("wall time", f"{report['wall_s']:.3f} s"),
        ("sent / answered / ok", f"{report['sent']} / {report['answered']} / {report['ok']}"),
        ("server errors (5xx)", str(report["server_errors"])),
        ("transport errors", str(report["transport_errors"])),
        ("cancelled / not sent", f"{report['cancelled']} / {report['not_sent']}"),
        ("requests/s (ok)", "-" if throughput["requests_per_s"] is None else f"{throughput['requests_per_s']:.2f}"),
        ("audio-s/s (ok)", "-" if throughput["audio_s_per_s"] is None else f"{throughput['audio_s_per_s']:.2f}"),
    ]
    for name in ("latency_ok", "latency_all_answered", "first_event"):
        latency = report.get(name)
        if latency:
            rows.append(
                (
                    name.replace("_", " "),
                    f"p50 {_fmt_s(latency['p50_s'])}  p90 {_fmt_s(latency['p90_s'])}  "
                    f"p99 {_fmt_s(latency['p99_s'])}  max {_fmt_s(latency['max_s'])}  (n={latency['count']})",
                )
            )
    for outcome, count in report["by_outcome"].items():
        rows.append((f"  outcome {outcome}", str(count)))
    for stop, count in report["stops"].items():
        rows.append((f"  stop {stop}", str(count)))
    memory = report.get("memory")
    if memory:
        scope = "process tree" if memory["includes_children"] else "process"
        rows.append(
            (
                f"gateway RSS ({scope}, pid {memory['pid']})",
                f"start {_fmt_bytes(memory['start_rss_bytes'])}  peak {_fmt_bytes(memory['peak_rss_bytes'])}  "
                f"end {_fmt_bytes(memory['end_rss_bytes'])}  ({memory['samples']} samples)",
            )
        )
        rows.append(("gateway VmHWM (main process)", _fmt_bytes(memory["vm_hwm_bytes"])))
        if memory["error"]:
            rows.append(("memory sampling error", memory["error"]))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


# -- command line -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--url", default="http://127.0.0.1:8000", help="gateway base URL (loopback unless --allow-remote)"
    )
    parser.add_argument("--concurrency", "-c", type=int, default=8, help="requests in flight at once")
    parser.add_argument("--requests", "-n", type=int, default=40, help="total requests to send")
    parser.add_argument("--time-limit", type=float, default=60.0, help="wall-clock cap in seconds")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--file", type=Path, help="audio file to send (default: a generated tone)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="length of the generated audio")
    parser.add_argument("--response-format", default="json")
    parser.add_argument("--stream", action="store_true", help="stream=true; also measures time to first event")
    parser.add_argument("--field", action="append", default=[], metavar="NAME=VALUE", help="extra form field")
    parser.add_argument("--header", action="append", default=[], metavar="NAME: VALUE", help="extra request header")
    parser.add_argument("--api-key", default=os.environ.get("MOSS_GATEWAY_API_KEY"), help="sent as a Bearer token")
    parser.add_argument("--pid", type=int, help="gateway process id: sample its RSS (and its children's)")
    parser.add_argument("--no-children", action="store_true", help="sample the --pid process alone")
    parser.add_argument("--sample-interval", type=float, default=0.05, help="RSS sampling period in seconds")
    parser.add_argument("--json-out", type=Path, help="write the full report as JSON here")
    parser.add_argument("--allow-remote", action="store_true", help="allow a URL that is not on loopback")
    parser.add_argument("--quiet", action="store_true", help="do not print the table")
    return parser


def _config_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> LoadConfig:
    if args.concurrency < 1 or args.requests < 1:
        parser.error("--concurrency and --requests must be at least 1")
    if not 0 < args.time_limit <= 24 * 3600:
        parser.error("--time-limit must be between 0 and 86400 seconds")
    if args.request_timeout <= 0 or args.sample_interval <= 0 or args.duration_s <= 0:
        parser.error("--request-timeout, --sample-interval and --duration-s must be positive")
    if not args.allow_remote and not is_loopback(args.url):
        parser.error(f"{args.url} is not a loopback address; pass --allow-remote to load a remote gateway")
    fields: dict[str, str] = {}
    for item in args.field:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--field {item!r}: expected NAME=VALUE")
        fields[name] = value
    headers: dict[str, str] = {}
    for item in args.header:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            parser.error(f"--header {item!r}: expected 'NAME: VALUE'")
        headers[name.strip()] = value.strip()
    if args.api_key:
        headers.setdefault("Authorization", f"Bearer {args.api_key}")
    return LoadConfig(
        url=args.url.rstrip("/"),
        concurrency=args.concurrency,
        requests=args.requests,
        time_limit_s=args.time_limit,
        request_timeout_s=args.request_timeout,
        response_format=args.response_format,
        stream=args.stream,
        fields=fields,
        headers=headers,
        filename=args.file.name if args.file else "loadtest.wav",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = _config_from(args, parser)
    if args.file:
        audio = args.file.read_bytes()
        audio_s = audio_duration(audio)
    else:
        audio = make_audio(args.duration_s)
        audio_s = args.duration_s
    sampler = MemorySampler(args.pid, args.sample_interval, not args.no_children) if args.pid else None
    if sampler is not None:
        with sampler:
            outcomes, wall = asyncio.run(run_load(config, audio, audio_s))
    else:
        outcomes, wall = asyncio.run(run_load(config, audio, audio_s))
    report = summarize(config, outcomes, wall, audio_s, sampler.report if sampler else None)
    if not args.quiet:
        print(render_table(report))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    healthy = report["server_errors"] == 0 and report["transport_errors"] == 0 and report["answered"] > 0
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
