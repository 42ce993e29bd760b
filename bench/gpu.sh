#!/usr/bin/env bash
# The prepared GPU check: one NVIDIA GPU, under 8 minutes, nothing downloaded. Run from anywhere:
#
#   bash bench/gpu.sh 2>&1 | tee gpu.log
#
# 1. The GPU's limits (bench/limits.py): bf16 and f32 matmul peaks on 2048-8192 products, HBM streaming bandwidth.
# 2. The sampler (bench/sampler.py): SmolLM2-135M's shapes in bf16 with random weights, batch 64 and 256, 32-token
#    prompts and 128 new tokens, against the HBM-bandwidth roofline, with where a decode step goes (attention over
#    the cache, the LM head, sampling over the 49k vocabulary, the rest of the layers).
# 3. One GRPO iteration at Qwen2.5-1.5B's shapes (bench/update.py): f32 weights, bf16 compute, 64 episodes of 1,024
#    tokens; rollout, scoring, diagnostics and update, each timed, and the MFU of each against the bf16 peak.
#
# Python: the machine's own `python3` (or $PYTHON) with JAX for CUDA, flax and optax. This repository's other pure-
# Python needs are installed from wheels in .whl/ when that folder exists (a machine that cannot reach an index):
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl gguf==0.19.0 ml-collections==1.1.0
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ -d .whl ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/ragen_jax_site .whl/*.whl
  export PYTHONPATH=/tmp/ragen_jax_site
fi
export PYTHONPATH=".:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PYTHON" -c "import jax; print('jax', jax.__version__, jax.devices())"
timeout 90 "$PYTHON" bench/limits.py
timeout 150 "$PYTHON" bench/sampler.py --random-weights --dtype bfloat16 --batches 64,256 --new-tokens 128 \
  --lora-rank 0 --profile-tokens 0  # the op profiles (bench/profiling.py) read XLA:CPU's trace; a GPU's names kernels
timeout 210 "$PYTHON" bench/update.py --models qwen2.5-1.5b --dtype bfloat16 --tokens 1024 --episodes 64 \
  --micro 4 --rollout --diagnostics --repeats 1 --no-profile
