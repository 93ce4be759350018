#!/usr/bin/env bash
# Device call 2 of 3: join and check the bundle, unpack vLLM 0.26.0 and the gateway's packages,
# then the short and long workloads (one engine; qualification on the GPU at start-up).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/device/common.sh
T0=$SECONDS
unpack_bundle  # joins the parts kept by the earlier calls and the one carried now
python3 -c "import vllm, fastapi, pydantic, uvicorn, av; print('vllm', vllm.__version__, 'fastapi', fastapi.__version__, 'pydantic', pydantic.__version__)"
python3 -m bench run --workload short,long "${ENGINE_ARGS[@]}" --qualify --allow-unqualified \
    --reference-device cuda --reference-dtype bfloat16 --out "$OUT/short-long.json" --deadline-s 470
cp "$STATE"/qualification/records/*.json "$OUT/" 2>/dev/null || true
