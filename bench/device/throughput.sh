#!/usr/bin/env bash
# Issue 13: the interleaved protocol on one H200 (python -m bench throughput): direct, gateway and
# vllm serve in every repetition, path order rotated, 3 repetitions, full-size random-weight checkpoint.
#
# First, here (no GPU), once: bash bench/device/prepare.sh  (the bundle in .whl/, with the four wheels
# vllm serve needs: model-hosting-container-standards, jmespath, supervisor, cloudpickle).
#
# Three device calls, kind nvidia-h200, back to back on the same machine (each within 30 s of the last;
# call a leaves the checkpoint and bundle part 0 in /tmp, call b leaves /tmp/site for call c):
#
#   run kind=nvidia-h200 carry=[".whl/early", ".whl/site_all.tar.xz.part-0", ".whl/SHA256SUMS"]
#       set -o pipefail; MOSS_GATEWAY_GIT_REVISION=<rev> bash bench/device/throughput.sh a 2>&1 | tee $OUT/a.log
#   run kind=nvidia-h200 carry=[".whl/site_all.tar.xz.part-1"]
#       bash bench/device/throughput.sh keep          (keeps part 1; within 30 s:)
#   run kind=KIND carry=[".whl/site_all.tar.xz.part-2"]
#       set -o pipefail; MOSS_GATEWAY_GIT_REVISION=<rev> bash bench/device/throughput.sh b 2>&1 | tee $OUT/b.log
#   run kind=nvidia-h200 carry=[]
#       set -o pipefail; MOSS_GATEWAY_GIT_REVISION=<rev> bash bench/device/throughput.sh c 2>&1 | tee $OUT/c.log
#
#   a (about 60 s): keeps bundle part 0, installs the early wheels, builds the checkpoint.
#   b (about 6-7 min): joins, checks and unpacks the bundle; ONE run of the protocol over the short cells
#       (12 s clips: c16 = 64 requests, c64 = 192 with 64 admission slots, c1 = 30; 153 tokens forced) ->
#       $OUT/short.json (+ short-vllm-serve.log). Two engine starts, at the same time: the gateway's
#       in-process engine (shared by direct and gateway) and vllm serve's.
#   c (about 7 min): 600 s x 8 (7,650 tokens each), 3 repetitions x 3 paths = 9 waves of about 34 s ->
#       $OUT/long.json. It does not fit in call b's 9.5 minutes after the short cells (unpack and two
#       engine starts take about 2 minutes, the short cells about 2-3), hence its own call and its own
#       two engine starts.
#
# The engines share the GPU, so each gets an explicit KV cache (KV_BYTES, default 24 GiB: 600 s x 8 needs
# about 8 x 15.6k tokens x 114,688 B = 14.3 GB) and a memory fraction that lets them fit side by side
# (MEM_FRACTION 0.28 each: three engines, the in-process one of direct and gateway, gateway-mp's own, which
# is the gateway with API_PROCESSES front-end processes (default 4, service/frontends.py), and vllm serve's).
# PATHS picks the paths (default direct,gateway,gateway-mp,vllm-serve). On a 2-GPU host, run with
# CUDA_VISIBLE_DEVICES=0 so that every engine shares one GPU as on the one-GPU host. The vllm serve command line is derived from the gateway's own engine arguments
# (bench/vllm_serve.py), so both engines have the same settings. DEADLINE_S (default 565) bounds a call.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/device/common.sh
T0=$SECONDS
DEADLINE=${DEADLINE_S:-565}
KV_BYTES=${KV_BYTES:-25769803776}
# Three engines side by side with the gateway-mp path (the in-process one, gateway-mp's, vllm serve's).
MEM_FRACTION=${MEM_FRACTION:-0.28}
PATHS=${PATHS:-direct,gateway,gateway-mp,vllm-serve}
API_PROCESSES=${API_PROCESSES:-4}
# The engine settings of common.sh, with the two-engine memory split instead of --gpu-memory-utilization 0.85.
PROTOCOL_ARGS=(--model "$CKPT" --max-model-len 131072 --max-num-batched-tokens 40960 --max-num-seqs 64
               --max-duration-s 3000 --gpu-memory-utilization "$MEM_FRACTION" --kv-cache-memory-bytes "$KV_BYTES"
               --state-dir "$STATE" --max-concurrent-requests 64 --no-qualify --allow-unqualified)

protocol() {  # $1: cells, $2: output file
  python3 -c "import vllm, fastapi, pydantic, uvicorn, av; print('vllm', vllm.__version__, 'fastapi', fastapi.__version__)"
  python3 -c "import cloudpickle, jmespath, supervisor, model_hosting_container_standards" \
    || echo "WARNING: the bundle lacks a wheel vllm serve needs (re-run prepare.sh); the vllm-serve path will be skipped"
  if ! python3 -c "import soundfile" 2>/dev/null; then  # call a did not run on this machine
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/early/*.whl || true
  fi
  build_checkpoint
  LEFT=$((DEADLINE - (SECONDS - T0)))
  BENCH_DEADLINE=$((LEFT - 45))   # shutdown of both servers and the copy of the results inside DEADLINE
  echo "protocol ($1) starts at $((SECONDS - T0)) s; hard limit ${LEFT} s, bench deadline ${BENCH_DEADLINE} s"
  rc=0
  timeout -k 10 "$LEFT" python3 -m bench throughput --cells "$1" --repeats "${REPEATS:-3}" "${PROTOCOL_ARGS[@]}" \
      --paths "$PATHS" --api-processes "$API_PROCESSES" \
      --start-timeout-s 300 --deadline-s "$BENCH_DEADLINE" --out "$2" || rc=$?
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv || true
  echo "done in $((SECONDS - T0)) s (bench rc=$rc)"
  return "$rc"
}

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
  echo "call a done in $((SECONDS - T0)) s"
  ;;
b)
  unpack_bundle
  protocol "${SHORT_CELLS:-short-12s-c16,short-12s-c64,short-12s-c1}" "$OUT/short.json"
  ;;
c)
  unpack_bundle  # no-op when call b ran on this machine
  protocol "${LONG_CELLS:-long-600s-c8}" "$OUT/long.json"
  ;;
*)
  echo "usage: bash bench/device/throughput.sh a|b|c" >&2
  exit 2
  ;;
esac
