# Sourced by the step scripts: the environment every step runs in on the GPU host.
# The host's python3 is 3.12 with torch 2.11.0+cu130 and transformers 5.17.0; everything
# else arrives as the bundle made by bench/device/prepare.sh and is unpacked into /tmp/site.
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD
export HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_USE_FLASHINFER_SAMPLER=0        # flashinfer is not installed there
export TOKENIZERS_PARALLELISM=false
export OUT=${OUT:-/tmp/out}
CKPT=/tmp/moss-fullsize
STATE=/tmp/bench-state
# The engine settings shared by every engine workload (one backend identity):
# context for the 2861.5 s program (about 38k prompt + 36.5k output tokens), an encoder
# budget that holds its 35,769 audio tokens in one item (vLLM's encoder cache), 64 sequences
# for the concurrency-64 cell, CUDA graphs on (no --enforce-eager), BF16 KV cache.
ENGINE_ARGS=(--model "$CKPT" --max-model-len 131072 --max-num-batched-tokens 40960 --max-num-seqs 64
             --max-duration-s 3000 --gpu-memory-utilization 0.85 --state-dir "$STATE")
mkdir -p "$OUT" /tmp/site /tmp/bundle
