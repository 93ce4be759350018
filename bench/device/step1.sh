#!/usr/bin/env bash
# Device call 1 of 3: check the host, install the small early wheels, build the full-size
# random checkpoint on the GPU, run the Transformers reference workload, keep bundle part 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/device/common.sh
keep_parts  # part 0; part 1 comes with a call of `bash -c 'source bench/device/common.sh; keep_parts'`, part 2 with step 2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/early/*.whl
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.max.sm --format=csv
python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, torch.cuda.get_device_name(0))"
python3 -m bench checkpoint --out "$CKPT" --device cuda
cp "$CKPT/bench_checkpoint_build.json" "$OUT/"
python3 -m bench run --workload reference --model "$CKPT" --out "$OUT/reference.json" \
    --reference-device cuda --reference-dtype bfloat16 --deadline-s 400
