#!/usr/bin/env bash
# Device call 3 of 3: the 2861.5 s program at one stream, on the same engine settings (same
# backend identity: a passing record from step 2 opens the gate; no re-qualification here).
# KV_CACHE_DTYPE=fp8 runs the FP8 KV-cache option instead (a different identity, so unqualified).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/device/common.sh
KV=${KV_CACHE_DTYPE:-auto}
WORKLOAD=${WORKLOAD:-program}
python3 -m bench run --workload "$WORKLOAD" "${ENGINE_ARGS[@]}" --kv-cache-dtype "$KV" --no-qualify --allow-unqualified \
    --out "$OUT/${WORKLOAD//,/-}-kv-$KV.json" --deadline-s 530
