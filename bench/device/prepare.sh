#!/usr/bin/env bash
# Make the bundle the GPU host needs, here (it reaches no package index). Run from the repo root.
# Result, in the ignored folder .whl/ (the device tool carries at most 64 MiB a call):
#   .whl/early/*.whl                 soundfile, cffi, pycparser, typing_extensions, httptools (call 1)
#   .whl/site_all.tar.xz.part-{0,1,2}  everything else, unpacked as `pip install --target` would, in three parts
#   .whl/SHA256SUMS                  of the joined archive (checked on the host before unpacking)
# The host already has Python 3.12, torch 2.11.0+cu130, transformers 5.17.0, numpy, httpx, tokenizers,
# safetensors, prometheus-client, uvloop... (see .library/device/KINDS.md and shared/facts/bench-host.md).
set -euo pipefail
W=${WORK:-/tmp/moss-bench-wheels}
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_26_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_5_x86_64)
DL=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}")
mkdir -p "$W"/vllm "$W"/small "$W"/early .whl/early
# 1. vLLM 0.26.0: the one release whose torch pin (2.11.0) matches the host; check its hash.
"${DL[@]}" -d "$W"/vllm vllm==0.26.0
echo "adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de  $(ls "$W"/vllm/vllm-0.26.0-*.whl)" | sha256sum -c
# 2. vLLM's run-time set as bench-host.md lists it, plus the gateway's own packages (pyproject pins).
#    openai stays on 2.x (3.x needs httpx2); compressed-tensors needs loguru. The last four are what
#    `vllm serve` (the protocol's reference server, bench/device/throughput.sh) needs on top (bench-host.md).
for p in aiocontextvars annotated-types astor blake3 cachetools cbor2 cffi compressed-tensors==0.17.0 depyf==0.20.0 \
         dill fastapi==0.136.3 ijson interegular jiter jsonschema jsonschema-specifications lark==1.2.2 \
         llguidance==1.7.6 lm-format-enforcer==0.11.3 msgspec openai==2.54.0 openai-harmony opentelemetry-api \
         opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-semantic-conventions-ai \
         outlines-core==0.2.14 partial-json-parser prometheus-fastapi-instrumentator pybase64 pycparser \
         pydantic==2.14.4 pydantic-core==2.50.5 python-json-logger pyzmq referencing rpds-py setproctitle sniffio \
         starlette==1.10.0 typing-inspection watchfiles xgrammar mistral-common pydantic-extra-types pycountry \
         apache-tvm-ffi==0.1.15.post2 uvicorn==0.54.0 pydantic-settings==2.16.3 python-dotenv \
         python-multipart==0.0.34 soundfile==0.14.0 soxr==1.1.0 av==18.1.0 loguru distro \
         model-hosting-container-standards jmespath supervisor cloudpickle sse-starlette==3.7.0 anyio; do
  "${DL[@]}" -d "$W"/small "$p"
done
for p in soundfile==0.14.0 cffi pycparser typing_extensions httptools==0.9.0; do "${DL[@]}" -d "$W"/early "$p"; done
# 3. Unpack as pip would (no compile), then trim vLLM of what this model never loads on an H200:
#    FlashAttention 2 (Hopper uses FA3), the MoE kernels (optional import), the Rust front end,
#    DeepGEMM/FMHA-SM100 headers and the DeepGEMM builds for other Pythons.
rm -rf "$W"/site && python3 -m pip install -q --no-deps --no-compile --target "$W"/site "${PLAT[@]}" \
    --python-version 3.12 --implementation cp --only-binary=:all: "$W"/small/*.whl "$W"/vllm/*.whl
rm -rf "$W"/site/bin "$W"/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$W"/site/vllm/_moe_C_stable_libtorch.abi3.so \
       "$W"/site/vllm/vllm-rs "$W"/site/vllm/third_party/deep_gemm/include "$W"/site/vllm/third_party/fmha_sm100/cutlass \
       "$W"/site/vllm/third_party/deep_gemm/_C.cpython-31[0134]-x86_64-linux-gnu.so
# 4. One xz archive (about 118 MB), split in three parts: each fits a device call with the working tree.
(cd "$W"/site && tar -cf - . | xz -9e -T0 > "$W"/site_all.tar.xz)
(cd "$W" && sha256sum site_all.tar.xz) > .whl/SHA256SUMS
rm -f .whl/site_all.tar.xz.part-*
split -n 3 -d -a 1 "$W"/site_all.tar.xz .whl/site_all.tar.xz.part-
cp "$W"/early/*.whl .whl/early/
ls -la .whl .whl/early
