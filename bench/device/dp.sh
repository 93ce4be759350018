#!/usr/bin/env bash
# Issue 17: vLLM data parallelism through the gateway on two H200s of one host (python -m bench.dp run):
# dp=1 against dp=2 at 128 streams of 12 s clips (153 tokens forced), and the 2861.5 s program through the
# chunked track on dp=2 (and dp=1 for comparison), 3 interleaved repetitions, full-size random checkpoint.
#
# First, here (no GPU), once: bash bench/device/prepare.sh  (the bundle in .whl/).
#
# Two device calls, kind nvidia-h200-x2, back to back on the same machine (call a leaves the checkpoint
# and bundle part 0 in /tmp):
#
#   run kind=nvidia-h200-x2 carry=[".whl/early", ".whl/site_all.tar.xz.part-0", ".whl/SHA256SUMS"]
#       set -o pipefail; MOSS_GATEWAY_GIT_REVISION=<rev> bash bench/device/dp.sh a 2>&1 | tee $OUT/a.log
#   run kind=nvidia-h200-x2 carry=[".whl/site_all.tar.xz.part-1"]
#       bash bench/device/dp.sh keep          (keeps part 1; within 30 s:)
#   run kind=KIND carry=[".whl/site_all.tar.xz.part-2"]
#       set -o pipefail; MOSS_GATEWAY_GIT_REVISION=<rev> bash bench/device/dp.sh b 2>&1 | tee $OUT/b.log
#
#   a (about 60 s): keeps bundle part 0, installs the early wheels, builds the checkpoint.
#   b (at most 565 s): unpacks the bundle, starts both gateways at once (about 60-90 s), warms each shape,
#       then the interleaved blocks -> $OUT/dp.json (rows: cell, path, repeat, wall_s, requests, dp) and the
#       gateways' logs. Copy dp.json to bench/results/<host>-<date>/dp.json, then here:
#       python -m bench.dp report bench/results/<host>-<date>/dp.json --plot docs/dp.png
#       and paste the table into docs/benchmarks.md.
#
# Memory: the two gateways run side by side for the whole call (so that one run can interleave dp=1 and
# dp=2 blocks; one after the other would mean a second engine start per repetition and no interleaving):
# the dp=1 engine on GPU 0, the dp=2 engine's ranks on GPUs 0 and 1. GPU 0 therefore holds two engines,
# each with MEM_FRACTION (0.40) of the GPU and an explicit KV cache of KV_BYTES (24 GiB: 128 x ~450 tokens
# x 114,688 B = 6.6 GB for the short cell; the program's chunks, spread over the ranks, well under it).
# Only one block runs at a time, so the engine not measured is idle. REPEATS (3), PROGRAM_DP ("2,1"; "2"
# to skip the dp=1 program when time is short), SHORT_DP ("1,2"; "" runs the program cells only),
# RENDERER_WORKERS (both gateways' engine.renderer_num_workers; unset: the gateway's default), FRONTEND_TORCH_THREADS
# (both gateways' server.frontend_torch_threads; unset: the gateway's default, 1), CHUNK_TARGET_S (290),
# API_PROCESSES_PER_RANK (4: front-end processes per rank, service/frontends.py; dp=2's gateway gets twice dp=1's, as
# vllm serve defaults its API servers to the data-parallel size), EXECUTOR (both gateways'
# engine.distributed_executor_backend, mp or uni; unset: vLLM's choice, mp as soon as dp > 1), HALF_CELL (1: also
# dp=1 at 64 streams, 0: not), GPUS (2; 1 on a one-GPU host, where SHORT_DP may name only dp=1 gateways) and
# DEADLINE_S (565). Two gateways with 4 and 8 front ends take about 110-130 s to be ready: DEADLINE_S >= 450.
# SHORT_DP and PROGRAM_DP take gateway labels: 1, 2, or a variant of either that changes one setting
# (1-mp, 2-uni: the executor; 1-fe32: the front ends' torch threads; 2-api8: front ends per rank), measured
# in the same repetitions and reported against the plain gateway of its dp (bench.dp's Gateway). A dp=1
# variant runs on the last GPU; three engines on one GPU need MEM_FRACTION=0.28.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/device/common.sh
T0=$SECONDS
DEADLINE=${DEADLINE_S:-565}

case "${1:-}" in
keep)  # a call that only brings one more part of the bundle
  keep_parts
  ;;
a)
  keep_parts
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/early/*.whl
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
  # the host's CPU layout (sockets, SMT, NUMA) and the GPUs' place in it: the front ends, engine cores and
  # workers of both gateways share these cores
  { lscpu || true; nvidia-smi topo -m || true; } 2>&1 | tee "$OUT/host-topology.txt"
  build_checkpoint
  echo "call a done in $((SECONDS - T0)) s"
  ;;
b)
  unpack_bundle
  if ! python3 -c "import soundfile" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/early/*.whl || true
  fi
  build_checkpoint
  LEFT=$((DEADLINE - (SECONDS - T0)))
  rc=0
  timeout -k 10 "$LEFT" python3 -m bench.dp run --model "$CKPT" --out "$OUT/dp.json" --repeats "${REPEATS:-3}" \
      --program-dp "${PROGRAM_DP-2,1}" --api-processes-per-rank "${API_PROCESSES_PER_RANK:-4}" --gpu-memory-utilization "${MEM_FRACTION:-0.40}" \
      --kv-cache-memory-bytes "${KV_BYTES:-25769803776}" --work-dir /tmp/bench-dp-work \
      --requests-per-worker "${REQUESTS_PER_WORKER:-2}" --client-processes "${CLIENT_PROCESSES:-8}" \
      --chunk-target-s "${CHUNK_TARGET_S:-290}" --short-dp "${SHORT_DP-1,2}" --gpus "${GPUS:-2}" $([ "${HALF_CELL:-1}" = 0 ] && echo --no-half-cell) \
      ${RENDERER_WORKERS:+--renderer-num-workers "$RENDERER_WORKERS"} ${FRONTEND_TORCH_THREADS:+--frontend-torch-threads "$FRONTEND_TORCH_THREADS"} ${EXECUTOR:+--distributed-executor-backend "$EXECUTOR"} --start-timeout-s 300 --deadline-s $((LEFT - 60)) --allow-unqualified || rc=$?
  cp /tmp/bench-dp-work/gateway-dp*.log "$OUT/" 2>/dev/null || true
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv || true
  echo "done in $((SECONDS - T0)) s (bench rc=$rc)"
  exit "$rc"
  ;;
*)
  echo "usage: bash bench/device/dp.sh a|b" >&2
  exit 2
  ;;
esac
