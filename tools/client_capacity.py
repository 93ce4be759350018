"""How many requests a second one `bench.client` process can send: the load generator's own ceiling.

    .venv/bin/python tools/client_capacity.py [--streams 128] [--per-stream 2] [--processes 1]

The figure docs/benchmarks.md and bench/client.py quote (one client process: about 166 requests a second,
7.5 ms of CPU a 384 KB request with its start-up, on the 2-core dev machine; 8 processes: 388 a second)
comes from this: a server that reads each upload and
answers at once (Starlette under uvicorn, 2 workers, its own process), 12 s noise clips as WAV files, and
`python -m bench.client` against it, timed from outside with its CPU seconds (user + system of the client
process and its shards). No engine and no gateway: what is left is the client's and the loopback's cost.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from bench.harness import _free_port  # noqa: E402
from bench.workloads import noise_pcm16, write_wav  # noqa: E402

SERVER = '''
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

async def transcribe(request):
    body = await request.body()
    return JSONResponse({"text": "", "bytes": len(body)}, headers={"x-moss-generated-tokens": "153"})

async def health(request):
    return JSONResponse({})

app = Starlette(routes=[Route("/v1/audio/transcriptions", transcribe, methods=["POST"]), Route("/health", health)])
'''


def wait_up(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise TimeoutError(f"the trivial server at {url} did not come up")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--per-stream", type=int, default=2)
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="client-capacity-") as work:
        folder = Path(work)
        (folder / "trivial_server.py").write_text(SERVER)
        n = args.streams * args.per_stream
        files = [str(write_wav(folder / f"s{i}.wav", noise_pcm16(12.0, 1000 + i))) for i in range(n)]
        body_bytes = Path(files[0]).stat().st_size
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        spec = {"url": url, "token": "t", "files": files, "concurrency": args.streams,
                "requests_per_worker": args.per_stream, "output_tokens": 153, "response_format": "json",
                "processes": args.processes}
        (folder / "spec.json").write_text(json.dumps(spec))
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "trivial_server:app", "--port", str(port), "--workers", "2",
             "--log-level", "warning"], cwd=folder,
        )
        try:
            wait_up(url)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-m", "bench.client", str(folder / "spec.json"), str(folder / "out.json")],
                           cwd=REPO, check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        finally:
            server.terminate()
            server.wait(timeout=30)
        out = json.loads((folder / "out.json").read_text())
    ok = sum(1 for r in out["records"] if r.get("status") == 200)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"{ok}/{n} answered in {out['wall_s']:.3f} s: {n / out['wall_s']:.0f} requests/s, "
          f"client CPU {1000 * cpu_s / n:.1f} ms a request (interpreter start and file reads included), "
          f"{args.processes} client process(es), {body_bytes} B a body")
    return 0 if ok == n else 1


if __name__ == "__main__":
    sys.exit(main())
