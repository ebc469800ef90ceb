#!/usr/bin/env bash
# A few launches served through vLLM's own runner on the lent GPU machine (the
# mock device: what differs there is the host, whose real accelerator vLLM's
# worker may ask about), each with graphs and eager, and what a user would see.
# Run from the repository root there, carrying .gpu and .whl/vllm as
# benchmarks/gpu_vllm_scale.sh does; SOURCE_TARBALL, optional, is laid over.
#
#   bash benchmarks/gpu_vllm_serve.sh OUTDIR [SOURCE_TARBALL]
set -u
OUT=${1:?OUTDIR}; SRC=${2:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
if [ ! -d /tmp/vllm-tree/vllm ]; then
  rm -rf /tmp/site /tmp/vllm-tree && mkdir -p /tmp/vllm-tree
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/vllm/*.whl
  tar -xJf "$(ls .gpu/vllm-*-tree.tar.xz | head -1)" -C /tmp/vllm-tree
fi
export PYTHONPATH=/tmp/site:/tmp/vllm-tree:.
if [ -n "$SRC" ]; then
  dest=/tmp/src-$(basename "$SRC" .tar.xz)
  [ -d "$dest" ] || { mkdir -p "$dest" && tar -xJf "$SRC" -C "$dest"; }
  export CGSIM_VLLM_SOURCE; CGSIM_VLLM_SOURCE=$(ls -d "$dest"/*/ | head -1)
fi
python3 - <<'PY' 2>&1 | grep -v "WARNING\|INFO" | tee "$OUT/serve.log"
from cgsim.config import ManagerConfig
from cgsim.modes import CUDAGraphMode
from cgsim.targets.vllm.compat import require_vllm
from cgsim.targets.vllm.engine import launch_for, with_dflash_draft
from cgsim.targets.vllm.runner_serve import served_consequence

print(f"vLLM {require_vllm().version}")
decode = launch_for(ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY, capture_sizes=(1, 2, 4), max_num_reqs=4))
eagle = launch_for(ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY, decode_query_len=3, capture_sizes=(3, 6),
                                 max_num_reqs=2))
for name, launch in (("decode", decode), ("dflash", with_dflash_draft(eagle))):
    print(name, launch.line(), "->", served_consequence(launch, 300), flush=True)
PY
