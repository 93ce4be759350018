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

# The full-size random-weight checkpoint, built once per machine; its build record goes back with $OUT.
build_checkpoint() {
  if ! python3 -c "import pydantic" 2>/dev/null; then  # the builder imports the gateway's settings
    echo "checkpoint: deferred until the bundle is unpacked (no pydantic yet)"
    return 0
  fi
  if [ ! -f "$CKPT/model.safetensors" ]; then
    python3 -m bench checkpoint --out "$CKPT" --device cuda
  fi
  cp "$CKPT/bench_checkpoint_build.json" "$OUT/" 2>/dev/null || true
}

# The bundle travels in parts (prepare.sh splits it in three, so that each call's carry stays under the
# device tool's 64 MiB with the working tree): each call that carries a part keeps it in /tmp/bundle.
keep_parts() {
  cp .whl/site_all.tar.xz.part-* .whl/SHA256SUMS /tmp/bundle/ 2>/dev/null || true
  ls /tmp/bundle
}

# Join the parts kept by earlier calls and carried by this one, check and unpack them into /tmp/site;
# nothing to do when an earlier call on this machine already unpacked it.
unpack_bundle() {
  if [ -d /tmp/site/vllm ]; then return; fi
  keep_parts
  cat /tmp/bundle/site_all.tar.xz.part-* > /tmp/bundle/site_all.tar.xz
  (cd /tmp/bundle && sha256sum -c SHA256SUMS)
  if command -v xz >/dev/null; then xz -dc -T0 /tmp/bundle/site_all.tar.xz | tar -xf - -C /tmp/site
  else python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" /tmp/bundle/site_all.tar.xz /tmp/site; fi
  rm -f /tmp/bundle/site_all.tar.xz*
  echo "bundle unpacked at $((SECONDS - T0)) s"
}
