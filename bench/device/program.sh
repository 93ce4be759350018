#!/usr/bin/env bash
# Issue 14 on one lent H200: the decode-step profile, a sweep of engine choices and the 2861.5 s program
# through the gateway (native and chunked), all inside call B (python -m bench.program device).
# Two device calls back to back (kind nvidia-h200; call B within 30 s of the end of call A, so that the
# machine, bundle part 0 and the checkpoint are still there), with the bundle of bench/device/prepare.sh in .whl/:
#
#   run kind=nvidia-h200 carry=[".whl/early", ".whl/site_all.tar.xz.part-0", ".whl/SHA256SUMS"] timeout_s=120
#       set -o pipefail; MOSS_GATEWAY_GIT_REVISION=<rev> bash bench/device/program.sh a 2>&1 | tee $OUT/callA.log
#   run kind=nvidia-h200 carry=[".whl/site_all.tar.xz.part-1"] timeout_s=60
#       bash bench/device/program.sh keep          (keeps part 1; within 30 s:)
#   run kind=nvidia-h200 carry=[".whl/site_all.tar.xz.part-2"] timeout_s=600
#       set -o pipefail; DEADLINE_S=565 MOSS_GATEWAY_GIT_REVISION=<rev> bash bench/device/program.sh b 2>&1 | tee $OUT/callB.log
#
# Call A (about 25 s): keeps bundle part 0, installs the early wheels, builds the full-size random checkpoint
# (the same as rerun.sh a). Call B (DEADLINE_S, default 565 s): joins, checks and unpacks the bundle
# (about 30 s), then bench.program device with what is left minus 15 s:
#   1. baseline engine (about 75 s to start cold): s/step at 900 s, 1800 s and 2861.5 s of audio (about
#      12k, 24k and 38k tokens of prompt; 400 forced tokens each) and a torch-profiler capture of about
#      100 decode steps at 38k context, summarised in profile_summary.{json,md};
#   2. the sweep (about 60-90 s a choice: engine start plus two s/step probes at 38k), by expected gain:
#      fp8-kv, triton-attn, fa-splits-128, ... while the program phase still fits;
#   3. the gateway with the fastest choice: warm-ups, the chunked program (10 chunks of about 290 s, all at
#      once, 3,650 forced tokens each), then the native program (36,492 forced tokens).
# Files back ($OUT, at most 8): callB.log, decode_steps.json (probes, sweep, estimates), profile_summary.json,
# profile_summary.md, program.json (rows {cell, path, wall_s, ...}, structure comparison), the qualification
# record when QUALIFY=1, bench_checkpoint_build.json.
# Knobs: SWEEP=fp8-kv,triton-attn (choices after the baseline, in order; default: all by expected gain),
# CHOICE=<name> (the program runs with it whatever the sweep finds), QUALIFY=1 (qualify the chosen setting at
# gateway start-up against a float32 Transformers reference on cuda; costs about 45 s of the sweep),
# CHUNK_TARGET_S=290, NO_PROFILE=1, PHASES=profile,sweep,program (default). With device time for a third call,
# give the sweep a call of its own: B1 with PHASES=profile,sweep, then within 30 s B2 (same machine: the
# unpacked bundle and the checkpoint are reused, the carry is the same) with PHASES=program CHOICE=<chosen in B1>.
#
# On a host of two GPUs (kind nvidia-h200-x2), `pair` runs both halves at once, each on its own GPU, CPU cores,
# state and vLLM cache (so neither measures the other's compiles): the sweep (B1: PHASES=profile,sweep, no
# profiler capture) on GPU 1 and the upper half of the cores, and the program with CHOICE (default baseline) qualified at start-up
# (B2: PHASES=program, QUALIFY) on GPU 0 and the lower half. Files back: $OUT/b1/{log,decode_steps.json},
# $OUT/b2/{log,program.json,decode_steps.json,<record>.json}. NEAR_TIE_MARGIN sets the qualification's margin
# (the full-size random checkpoint's, calibrated on an H200: 5.11, qualification/calibration/).
#   run kind=nvidia-h200-x2 carry=[".whl/site_all.tar.xz.part-2"] timeout_s=600
#       set -o pipefail; DEADLINE_S=565 MOSS_GATEWAY_GIT_REVISION=<rev> bash bench/device/program.sh pair 2>&1 | tee $OUT/pair.log
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
  exec bash bench/device/rerun.sh a
  ;;
b)
  if [ ! -f /tmp/bundle/site_all.tar.xz.part-0 ] && [ ! -d /tmp/site/vllm ]; then
    echo "bundle part 0 is not on this machine: call A ran on another one (or more than 30 s ago). Run call A again, then B at once." >&2
    exit 3
  fi
  unpack_bundle
  if ! python3 -c "import soundfile" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/early/*.whl || true
  fi
  build_checkpoint
  nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.max.sm --format=csv,noheader || true
  LEFT=$((DEADLINE - (SECONDS - T0)))
  echo "bench.program starts at $((SECONDS - T0)) s with ${LEFT} s left"
  rc=0
  timeout -k 10 "$LEFT" python3 -m bench.program device --model "$CKPT" --out-dir "$OUT" --deadline-s $((LEFT - 15)) \
      --state-dir "$STATE" --no-plot ${SWEEP:+--sweep "$SWEEP"} ${CHOICE:+--choice "$CHOICE"} \
      ${CHUNK_TARGET_S:+--chunk-target-s "$CHUNK_TARGET_S"} ${NO_PROFILE:+--no-profile} ${PHASES:+--phases "$PHASES"} \
      $( [ "${QUALIFY:-0}" = 1 ] && echo --qualify ) || rc=$?
  cp "$STATE"/qualification/records/*.json "$OUT/" 2>/dev/null || true
  echo "call B done in $((SECONDS - T0)) s (bench.program rc=$rc)"
  exit "$rc"
  ;;
pair)
  unpack_bundle
  if ! python3 -c "import soundfile" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/early/*.whl || true
  fi
  build_checkpoint
  LEFT=$((DEADLINE - (SECONDS - T0)))
  echo "pair starts at $((SECONDS - T0)) s with ${LEFT} s left"
  pin() { if command -v taskset >/dev/null && taskset -c "$1" true 2>/dev/null; then taskset -c "$1" "${@:2}"; else "${@:2}"; fi; }
  HALF=$(( $(nproc) / 2 ))
  mkdir -p "$OUT/b1" "$OUT/b2"
  ( export CUDA_VISIBLE_DEVICES=1 VLLM_CACHE_ROOT=/tmp/vllm-cache-b1
    pin "$HALF-$((2 * HALF - 1))" timeout -k 10 "$LEFT" python3 -m bench.program device --model "$CKPT" --out-dir "$OUT/b1" \
        --deadline-s $((LEFT - 15)) --state-dir /tmp/state-b1 --no-plot --no-profile --phases profile,sweep \
        ${SWEEP:+--sweep "$SWEEP"} > "$OUT/b1/log" 2>&1 ) &
  B1=$!
  ( export CUDA_VISIBLE_DEVICES=0 VLLM_CACHE_ROOT=/tmp/vllm-cache-b2
    pin "0-$((HALF - 1))" timeout -k 10 "$LEFT" python3 -m bench.program device --model "$CKPT" --out-dir "$OUT/b2" \
        --deadline-s $((LEFT - 15)) --state-dir /tmp/state-b2 --no-plot --phases program --choice "${CHOICE:-baseline}" \
        --qualify ${CHUNK_TARGET_S:+--chunk-target-s "$CHUNK_TARGET_S"} ${NEAR_TIE_MARGIN:+--near-tie-margin "$NEAR_TIE_MARGIN"} \
        > "$OUT/b2/log" 2>&1 ) &
  B2=$!
  rc1=0; rc2=0
  wait "$B1" || rc1=$?
  wait "$B2" || rc2=$?
  cp /tmp/state-b2/qualification/records/*.json "$OUT/b2/" 2>/dev/null || true
  rm -f "$OUT/bench_checkpoint_build.json"
  tail -n 25 "$OUT/b1/log"; tail -n 25 "$OUT/b2/log"
  echo "pair done in $((SECONDS - T0)) s (sweep rc=$rc1, program rc=$rc2)"
  ;;
*)
  echo "usage: bash bench/device/program.sh a|keep|b|pair" >&2
  exit 2
  ;;
esac
