#!/usr/bin/env bash
# The environment of cgsim's sglang target: an sglang release on the CPU torch
# wheel, its CUDA-graph runners importable on CPU.  Idempotent: re-running
# repairs a partial install; another VERSION replaces the installed sglang.
#
#   usage: scripts/install_sglang.sh VENV [VERSION]   (VERSION default: the newest the index has)
#   env:   PYTHON        interpreter for a new venv (default python3)
#          TORCH_SPEC    default torch==2.13.0 (the CPU wheel cgsim pins)
#          SGL_NO_PRUNE  1 keeps the sglang subtrees the runners never import
#
# In this order (torch first, sglang --no-deps):
#   1. venv; torch
#   2. sglang==VERSION --no-deps: it pins torch (2.14.1 for 0.5.23), flashinfer,
#      sglang-kernel and CUDA packages, none of which may come in
#   3. the few packages its import chain really uses (pinned)
#   4. import-time stand-ins (scripts/sglang_standins) into site-packages,
#      never over an installed distribution of the same name
#   5. prune sglang subtrees nothing on the runners' path imports, and
#      libtorch's C++ test binaries (about 210 MB)
#   6. cgsim itself, editable, with its test tools
#   7. smoke test: cgsim's sglang target drives the tree (one capture), torch is
#      still the one installed in 1
set -euo pipefail

VENV=${1:?usage: scripts/install_sglang.sh VENV [VERSION]}
VERSION=${2:-}
if [ -n "$VERSION" ] && ! [[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$ ]]; then
  echo "install_sglang.sh: VERSION '$VERSION' is not a release number; give one such as 0.5.22 (or none for the newest)" >&2
  exit 2
fi
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STANDINS="$REPO/scripts/sglang_standins"
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
# Imported at module level on the runners' path and used for real:
# msgspec.Struct subclasses, pydantic models built at import, the capture
# loop's tqdm, dill through torch.utils.data, numpy, packaging, psutil.
RUNTIME_PKGS=(numpy==2.4.6 packaging==26.4 psutil==7.2.2 msgspec==0.23.0 pydantic==2.14.4
              tqdm==4.70.1 dill==0.4.1)

t0=$(date +%s)
step() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

if [ ! -x "$VENV/bin/python" ]; then
  step "venv $VENV"
  "$PY" -m venv "$VENV"
fi
PYV="$VENV/bin/python"
# pip's resolver lists every sglang requirement left out on purpose, and local
# index locations it cannot read: noise, filtered (pipefail keeps pip's status).
PIP_NOISE="which is not installed|which is incompatible|dependency resolver does not|is ignored: it is neither"
pip_q() { "$PYV" -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v -E "$PIP_NOISE" || true; }; }
torch_version() { "$PYV" -c "import torch; print(torch.__version__)" 2>/dev/null || true; }

want_torch=${TORCH_SPEC#torch==}
if [[ "$(torch_version)" != "$want_torch"* ]]; then
  step "$TORCH_SPEC"
  pip_q install "$TORCH_SPEC"
fi
installed_torch=$(torch_version)

sglang_version() { "$PYV" -c "import importlib.metadata as m; print(m.version('sglang'))" 2>/dev/null || true; }
if [ -z "$VERSION" ]; then
  # The newest release the index has (what a plain pip install would take).
  VERSION=$("$PYV" -m pip --disable-pip-version-check index versions sglang 2>/dev/null \
            | sed -n 's/^sglang (\(.*\))$/\1/p' | head -1)
  if [ -z "$VERSION" ]; then
    echo "install_sglang.sh: the package index lists no sglang release; give VERSION or check pip's index settings" >&2
    exit 2
  fi
fi
if [ "$(sglang_version)" != "$VERSION" ]; then
  step "sglang==$VERSION --no-deps"
  # A stale tree of another release (pruned files, stand-ins) must not survive the switch.
  pip_q uninstall -y sglang
  pip_q install --no-deps --force-reinstall "sglang==$VERSION"
fi

step "runtime packages"
pip_q install "${RUNTIME_PKGS[@]}"

SITE=$("$PYV" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
step "stand-ins -> $SITE"
installed=$("$PYV" -m pip list --format=freeze 2>/dev/null | cut -d= -f1 | tr 'A-Z_' 'a-z-')
manifest="$SITE/cgsim_sglang_standins.txt"
: > "$manifest.new"
cp "$STANDINS/_cgsim_standin.py" "$SITE/_cgsim_standin.py"
for d in "$STANDINS"/*/; do
  name=$(basename "$d")
  dist=$(echo "$name" | tr 'A-Z_' 'a-z-')
  case "$name" in PIL) dist=pillow;; yaml) dist=pyyaml;; zmq) dist=pyzmq;; tvm_ffi) dist=apache-tvm-ffi;; esac
  if echo "$installed" | grep -qx "$dist"; then
    echo "   keep the installed $dist (no stand-in for $name)"; continue
  fi
  rm -rf "${SITE:?}/$name"
  cp -r "$d" "$SITE/$name"
  find "$SITE/$name" -name __pycache__ -prune -exec rm -rf {} +
  echo "$name" >> "$manifest.new"
done
mv "$manifest.new" "$manifest"

if [ "${SGL_NO_PRUNE:-0}" != 1 ]; then
  step "prune what the runners never import (SGL_NO_PRUNE=1 keeps it)"
  rm -rf "$SITE/sglang/multimodal_gen"                   # diffusion serving
  rm -f  "$SITE"/sglang/srt/rust_extensions/*.so          # Rust server / grpc
  rm -f  "$SITE"/sglang/srt/mem_cache/rust_tree_core/*.so
  rm -rf "$SITE/torch/test"                              # libtorch C++ test binaries
  find "$SITE/torch/bin" -maxdepth 1 -type f \( -name 'test_*' -o -name '*Test' \) -delete
fi

step "cgsim (editable) from $REPO"
pip_q install -e "$REPO"
if [ "$(torch_version)" != "$installed_torch" ]; then
  echo "torch changed from $installed_torch to $(torch_version) while installing: aborting" >&2
  exit 1
fi

step "smoke test"
"$PYV" -W ignore - <<'EOF'
import importlib
for m in ("hypothesis", "pytest"):
    importlib.import_module(m)
import sys, torch
from cgsim.targets.sglang import SglangEnvironmentError, require_sglang
from cgsim.targets.sglang.compat import probe
try:
    version = require_sglang()
except SglangEnvironmentError as exc:
    sys.exit(f"install_sglang.sh: {exc}")
print(f"   ok: sglang {version} (ruleset {probe().ruleset}), torch {torch.__version__}, python {sys.version.split()[0]}")
EOF
step "done; $(du -sh "$VENV" | cut -f1) in $VENV"
