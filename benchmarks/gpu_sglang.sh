#!/usr/bin/env bash
# SGLang's own CUDA-graph runners on a lent GPU machine that cannot download
# anything: unpack the carried sglang tree and cgsim's stand-ins into a temp
# dir, install the few carried wheels the image lacks beside the image's
# torch, then run the SGLang part of the agreement corpus on the mock (the
# bundle works) and on real CUDA graphs (mock vs CUDA).  Run from the
# repository root there:
#
#   bash benchmarks/gpu_sglang.sh [OUTDIR]     # (the device call carries .gpu and .whl/sglang)
#   CGSIM_GPU_SGLANG=mutations bash benchmarks/gpu_sglang.sh [OUTDIR]   # instead: the runner-mutation table
#
# Carried, built on a machine with network by benchmarks/make_gpu_sglang_bundle.sh:
#   .gpu/sglang-<version>-tree.tar.xz   sglang's pruned pure-Python tree, its dist-info, standins/
#   .whl/sglang/*.whl                   wheels of sglang's runtime packages (install_sglang.sh's pins)
# By default a package the image has wins over its stand-in (install_sglang.sh's rule): on a GPU
# sglang's buffer copies launch triton kernels, which the triton stand-in refuses (seen on an H200).
# CGSIM_STANDINS=all puts every stand-in first, as the CPU target is tested.
# Everything lands in OUTDIR (default $OUT): gpu_sglang.log, sglang_agreement{,_mock}.json, a 90 s cuda
# campaign's campaign.log and reports.tgz.
set -u
OUT=${1:-${OUT:-gpu-sglang-out}}
mkdir -p "$OUT"
log="$OUT/gpu_sglang.log"
say() { echo "== $* ($(date +%T))" | tee -a "$log"; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1
tree=$(ls .gpu/sglang-*-tree.tar.xz 2>/dev/null | head -1)
wheels=${CGSIM_WHEELS:-.whl/sglang}
[ -n "$tree" ] || { echo "no .gpu/sglang-*-tree.tar.xz: build it with benchmarks/make_gpu_sglang_bundle.sh" | tee -a "$log"; exit 2; }

tmp=$(mktemp -d /tmp/cgsim-sglang.XXXXXX)
say "unpack $tree into $tmp"
tar -xJf "$tree" -C "$tmp" || { echo "tree unpack failed" | tee -a "$log"; exit 2; }
mkdir -p "$tmp/tree" "$tmp/site" "$tmp/used-standins"
mv "$tmp"/sglang "$tmp"/sglang-*.dist-info "$tmp/tree/"
# Which stand-ins go on the path, and which carried wheels the image needs (numpy, packaging, psutil
# and typing-extensions only where it lacks them: its torch was built beside its own).
python3 - "$tmp" "$wheels" "${CGSIM_STANDINS:-installed-first}" <<'PY' 2>&1 | tee -a "$log"
import glob, importlib.metadata as md, os, shutil, sys
tmp, wheels, policy = sys.argv[1:4]
dists = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in md.distributions()}
alias = {"PIL": "pillow", "yaml": "pyyaml", "zmq": "pyzmq", "tvm_ffi": "apache-tvm-ffi"}
used, kept = [], []
for path in sorted(glob.glob(os.path.join(tmp, "standins", "*"))):
    name = os.path.basename(path)
    dist = alias.get(name, name.lower().replace("_", "-"))
    if policy == "installed-first" and dist in dists and name != "_cgsim_standin.py":
        kept.append(name)
        continue
    (shutil.copytree if os.path.isdir(path) else shutil.copy)(path, os.path.join(tmp, "used-standins", name))
    used.append(name)
print(f"stand-ins used: {' '.join(used)}; the image's own: {' '.join(kept) or '-'}")
only_if_missing = {"numpy", "packaging", "psutil", "typing-extensions"}
todo = []
for whl in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
    dist = os.path.basename(whl).split("-")[0].lower().replace("_", "-")
    if dist in only_if_missing and dist in dists:
        continue
    todo.append(whl)
open(os.path.join(tmp, "wheels.txt"), "w").write("\n".join(todo))
print("wheels to install:", " ".join(os.path.basename(w).split("-")[0] for w in todo))
PY
if [ -s "$tmp/wheels.txt" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$tmp/site" \
    $(cat "$tmp/wheels.txt") 2>&1 | tail -3 | tee -a "$log"
fi
export PYTHONPATH="$tmp/site:$tmp/used-standins:$tmp/tree:$PWD"
python3 -c 'import sys, torch, sglang, cgsim; print(sys.version.split()[0], "torch", torch.__version__, "sglang",
    sglang.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU", "cgsim", cgsim.__file__)' \
  2>&1 | grep -v Warn | tail -1 | tee -a "$log"

if [ "${CGSIM_GPU_SGLANG:-}" = "mutations" ]; then
  # The runner-mutation table on this machine's cores: one process per mutation, all at once.
  say "bench_sglang.py --runner-mutations: one process per mutation, 5 seeds, 60 s each"
  names=$(python3 -c "from cgsim.targets.sglang.mutation import MUTATIONS; print(' '.join(m.name for m in MUTATIONS))" \
    2>/dev/null | tail -1)
  for n in $names; do
    timeout 420 python3 benchmarks/bench_sglang.py --runner-mutations --seeds 5 --limit-s 60 --only "$n" \
      > "$tmp/mut_$n.txt" 2>&1 &
  done
  wait
  for n in $names; do grep "^| $n " "$tmp/mut_$n.txt" || echo "| $n | (no row: see the process's output) |"; done \
    | tee -a "$log"
  rm -rf "$tmp"
  say done
  exit 0
fi

say "SGLang agreement corpus on the mock (the bundle works)"
timeout 150 python3 tests/agreement/sglang_agreement.py check --backend mock --jobs 8 \
  --json "$OUT/sglang_agreement_mock.json" 2>&1 | grep -v "Warn" | tail -3 | tee -a "$log"

say "SGLang agreement corpus: mock vs real CUDA graphs (one forked child per entry, 8 at a time)"
timeout 360 python3 tests/agreement/sglang_agreement.py check --backend cuda --jobs 8 \
  --json "$OUT/sglang_agreement.json" 2>&1 | grep -v "Warn" | tail -80 | tee -a "$log"
echo "cuda check exit ${PIPESTATUS[0]}" | tee -a "$log"

say "campaign: --target sglang --backend cuda, 90 s"
rm -rf /tmp/sglang-reports
timeout 200 python3 -m fuzz run --target sglang --backend cuda --budget 90s --seed 1 --workers 4 --force-workers \
  --report-dir /tmp/sglang-reports --quiet > "$OUT/campaign.log" 2>&1
echo "campaign exit $? (0 clean, 1 findings, 2 environment)" | tee -a "$log"
python3 - <<'PY' 2>&1 | grep -v Warn | tee -a "$log"
import json
import sglang
from cgsim.finding import Finding
from cgsim.targets.sglang.known import classify
d = json.load(open("/tmp/sglang-reports/latest/summary.json"))
print(f"scenarios={d['scenarios']} elapsed_s={d['elapsed_s']} scenarios_per_s={d['scenarios_per_s']}")
for f in d["findings"]:
    known = classify(Finding.from_json(f), sglang.__version__)
    print(f"  {f['property']}: {known.name if known else 'NOT DOCUMENTED'}: {f['message'][:160]}")
PY
tar czf "$OUT/reports.tgz" -C /tmp sglang-reports 2>/dev/null
rm -rf "$tmp"
say done
