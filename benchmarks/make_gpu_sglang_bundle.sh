#!/usr/bin/env bash
# Build what benchmarks/gpu_sglang.sh carries to a GPU machine without network
# (the device tool carries at most 64 MiB with the repository):
#   .gpu/sglang-<version>-tree.tar.xz   sglang's pure-Python tree as scripts/install_sglang.sh lays it out
#                                       (no compiled libraries, kernel-tuning JSONs, CUDA sources, tests,
#                                       benchmarks or subtrees the runners' import chain never imports; the
#                                       dist-info stays: the target reads the release from it), and
#                                       cgsim's import-time stand-ins (scripts/sglang_standins) under standins/
#   .whl/sglang/*.whl                   wheels of the runtime packages install_sglang.sh pins (and pydantic's
#                                       own), for an image with torch that may lack them
# Both folders are ignored by git.  Run from the repository root:
#   bash benchmarks/make_gpu_sglang_bundle.sh [VERSION] [PYTHON_VERSION]   # defaults 0.5.23 3.12
# PYTHON_VERSION picks the wheels' interpreter (the GPU image's is 3.12; a local check of the bundle
# in another Python takes that one's wheels: WHEELS_DIR=.whl/sglang-cp311 ... 3.11).
set -eu
version=${1:-0.5.23}
pyver=${2:-3.12}
wheels_dir=${WHEELS_DIR:-.whl/sglang}
mkdir -p .gpu "$wheels_dir"
dl=$(mktemp -d)
work=$(mktemp -d)
trap 'rm -rf "$dl" "$work"' EXIT
python3 -m pip download -q --no-deps -d "$dl" "sglang==$version" 2>&1 | grep -v "is ignored" || true
python3 -m zipfile -e "$dl"/sglang-*.whl "$work"
s="$work/sglang"
# What install_sglang.sh prunes, and what the runners' import chain never reaches (traced over the
# whole agreement corpus: no module of these subtrees is imported).
rm -rf "$s/multimodal_gen" "$s/test" "$s/benchmark" "$s/api" "$s/cli" "$s/srt/weight_cache" "$s/srt/rust_server" \
  "$s/srt/rust_extensions" "$s/srt/ray" "$s/srt/checkpoint_engine" "$s/srt/tokenizer"
find "$s" \( -name '*.so' -o -name '*.json' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.cpp' \
  -o -name '*.md' \) -delete
find "$s" -name __pycache__ -prune -exec rm -rf {} +
rm -f "$work"/sglang-*.dist-info/RECORD  # it lists the pruned files
mkdir "$work/standins"
cp -r scripts/sglang_standins/. "$work/standins/"
find "$work/standins" -name __pycache__ -prune -exec rm -rf {} +
(cd "$work" && tar -cf - sglang sglang-*.dist-info standins) | xz -9e -T1 > ".gpu/sglang-$version-tree.tar.xz"
# install_sglang.sh's RUNTIME_PKGS and pydantic's dependencies (versions as it installs them).
wheels="numpy==2.4.6 packaging==26.4 psutil==7.2.2 msgspec==0.23.0 pydantic==2.14.4 pydantic-core==2.50.5
annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 tqdm==4.70.1 dill==0.4.1"
for w in $wheels; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$wheels_dir" "$w" 2>&1 | grep -v "is ignored" || true
done
du -sh ".gpu/sglang-$version-tree.tar.xz" "$wheels_dir"
