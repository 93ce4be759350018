#!/usr/bin/env bash
# The 2026-11-30 re-run (after 8cbdcd9: final-only engine outputs for unstreamed short passes, relative
# near-tie tolerance): two device calls back to back on a fresh H200, each within 30 s of the last.
#   call A: bash bench/device/rerun.sh a   carry .whl/early .whl/site_all.tar.xz.part-0 .whl/SHA256SUMS
#           keeps part 0, installs the early wheels, builds the full-size random checkpoint.
#   call K: bash bench/device/rerun.sh keep carry .whl/site_all.tar.xz.part-1   (keeps part 1)
#   call B: bash bench/device/rerun.sh b   carry .whl/site_all.tar.xz.part-2
#           joins, checks and unpacks the bundle, then the short workload (12 s at 1, 4, 16, 64;
#           direct, gateway, plus direct-final from 4) with qualification at start-up against a
#           FLOAT32 Transformers reference on cuda; --allow-unqualified stays as the fallback.
# DEADLINE_S (default 560): the whole of call B ends by then (the bench gets what is left minus a margin).
# MAX_CONCURRENT (unset in the 2026-11-30 re-run): the gateway's admission slots; unset keeps its default
# of 16, which caps the concurrency-64 cell at 16 requests in the engine. Set MAX_CONCURRENT=64 to compare
# the gateway with the direct engine at 64.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/device/common.sh
T0=$SECONDS
DEADLINE=${DEADLINE_S:-560}

case "${1:-}" in
keep)  # a call that only brings one more part of the bundle
  keep_parts
  ;;
a)
  keep_parts
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/early/*.whl
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, torch.cuda.get_device_name(0))"
  build_checkpoint
  ls -la /tmp/bundle "$CKPT"
  echo "call A done in $((SECONDS - T0)) s"
  ;;
b)
  unpack_bundle
  python3 -c "import vllm, fastapi, pydantic, uvicorn, av; print('vllm', vllm.__version__, 'fastapi', fastapi.__version__, 'pydantic', pydantic.__version__)"
  if ! python3 -c "import soundfile" 2>/dev/null; then  # call A did not run on this machine
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/early/*.whl || true
  fi
  build_checkpoint
  LEFT=$((DEADLINE - (SECONDS - T0)))
  BENCH_DEADLINE=$((LEFT - 45))   # shutdown, records copy and return inside DEADLINE
  echo "bench starts at $((SECONDS - T0)) s; hard limit ${LEFT} s, bench deadline ${BENCH_DEADLINE} s"
  rc=0
  timeout -k 10 "$LEFT" python3 -m bench run --workload short \
      --cells short-12s-c1,short-12s-c4,short-12s-c16,short-12s-c64 \
      --add-path direct-final --add-path-min-concurrency 4 \
      "${ENGINE_ARGS[@]}" ${MAX_CONCURRENT:+--max-concurrent-requests "$MAX_CONCURRENT"} --qualify --allow-unqualified \
      --reference-device cuda --reference-dtype float32 \
      --start-timeout-s "$BENCH_DEADLINE" --deadline-s "$BENCH_DEADLINE" --out "$OUT/short.json" || rc=$?
  cp "$STATE"/qualification/records/*.json "$OUT/" 2>/dev/null || true
  echo "call B done in $((SECONDS - T0)) s (bench rc=$rc)"
  exit "$rc"
  ;;
*)
  echo "usage: bash bench/device/rerun.sh a|b" >&2
  exit 2
  ;;
esac
