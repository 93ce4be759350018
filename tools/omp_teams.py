"""How many OS threads a front end's feature extraction starts, with torch's default intra-op threads and with 1.

    .venv/bin/python tools/omp_teams.py [--workers 8] [--clips 64]

Each measurement runs in a fresh Python process (torch's thread pools are per process and never shrink):
`--workers` threads extract the features of 12 s of noise at once, as a front end's renderer does, and the
process's OS threads are counted afterwards. Every Python thread that runs a parallel torch op gets its own
OpenMP team, so with torch's default (one thread per CPU) the count grows by workers x (CPUs - 1); with
`server.frontend_torch_threads=1` it does not. docs/operations.md quotes this tool's counts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, os, sys
from concurrent.futures import ThreadPoolExecutor
import numpy as np, torch
from transformers import WhisperFeatureExtractor
threads, workers, clips = (int(x) for x in sys.argv[1:4])
if threads > 0:
    torch.set_num_threads(threads)
extractor = WhisperFeatureExtractor(feature_size=128)
audio = np.random.default_rng(0).standard_normal(16000 * 12).astype(np.float32)
with ThreadPoolExecutor(workers) as pool:
    list(pool.map(lambda _: extractor(audio, sampling_rate=16000, return_tensors="np"), range(clips)))
    print(json.dumps({"torch_threads": torch.get_num_threads(), "os_threads": len(os.listdir(f"/proc/{os.getpid()}/task"))}))
"""


def measure(threads: int, workers: int, clips: int) -> dict[str, int]:
    """One fresh process: torch's threads (0: its default), then `workers` threads extracting `clips` at once."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(threads), str(workers), str(clips)],
                         check=True, capture_output=True, text=True, timeout=300)
    result: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--clips", type=int, default=64)
    args = parser.parse_args()
    for threads in (0, 1):
        print(json.dumps({"setting": "torch default" if threads == 0 else "1", "workers": args.workers,
                          **measure(threads, args.workers, args.clips)}), flush=True)


if __name__ == "__main__":
    main()
