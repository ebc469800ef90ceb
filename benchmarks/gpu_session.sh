#!/usr/bin/env bash
# The GPU runs of cgsim, batched for a lent GPU machine (no network, torch
# preinstalled, run from the checkout):
#   bash benchmarks/gpu_session.sh full OUTDIR      # one H200: fidelity, agreement corpus,
#                                                   # mutant finding + repro on both backends,
#                                                   # nightly campaign, mock-vs-cuda throughput
#   bash benchmarks/gpu_session.sh scaling OUTDIR   # two H200s: the same nightly scenarios on 1 then 2 GPUs,
#                                                   # local workers and (where Ray imports) Ray actors
# Everything it prints lands in OUTDIR/session.log; JUnit files beside it.
set -u
what=${1:-full}
OUT=${2:-${OUT:-gpu-out}}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
log="$OUT/session.log"
say() { echo "== $*" | tee -a "$log"; }
summary() {  # scenarios/s and findings of a campaign report dir
  python3 - "$1" <<'PY' | tee -a "$log"
import json, sys
d = json.load(open(sys.argv[1] + "/latest/summary.json"))
print(f"scenarios={d['scenarios']} elapsed_s={d['elapsed_s']} scenarios_per_s={d['scenarios_per_s']} "
      f"workers={len(d['workers'])} findings={[f['property'] for f in d['findings']]}")
PY
}
python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.device_count(), torch.cuda.get_device_name(0))' 2>&1 | tee -a "$log"

if [ "$what" = full ]; then
  say "fidelity: tests/cgsim/cuda_mock/test_cuda_mock.py on real CUDA"
  timeout 150 python3 -m pytest -p cgsim.pytest_plugin tests/cgsim/cuda_mock/test_cuda_mock.py --cgsim-backend=cuda -q -p no:cacheprovider \
    --junitxml="$OUT/fidelity.xml" 2>&1 | tail -40 | tee -a "$log"
  say "agreement corpus: mock vs cuda"
  timeout 240 python3 -m pytest -p cgsim.pytest_plugin tests/agreement/test_agreement.py --cgsim-backend=cuda -q -n 8 -p no:cacheprovider \
    --junitxml="$OUT/agreement.xml" 2>&1 | tail -40 | tee -a "$log"
  say "mutant campaign on cuda, then its repro scripts on cuda and on the mock"
  timeout 100 python3 -m fuzz run --target mutant:rebind-metadata --backend cuda --budget 30s --seed 1 \
    --report-dir /tmp/mutant --quiet; echo "campaign exit $?" | tee -a "$log"
  summary /tmp/mutant
  for r in /tmp/mutant/latest/findings/repro_*.py; do
    timeout 60 python3 "$r" --backend cuda 2>&1 | tail -2 | tee -a "$log"; echo "repro --backend cuda exit ${PIPESTATUS[0]}" | tee -a "$log"
    timeout 60 python3 "$r" --backend mock 2>&1 | tail -2 | tee -a "$log"; echo "repro --backend mock exit ${PIPESTATUS[0]}" | tee -a "$log"
  done
  say "nightly campaign on every visible GPU (reference)"
  timeout 120 python3 -m fuzz run --backend cuda --gpus auto --profile nightly --budget 60s --seed 7 \
    --report-dir /tmp/nightly --quiet; echo "nightly exit $?" | tee -a "$log"
  summary /tmp/nightly
  cp /tmp/nightly/latest/junit.xml "$OUT/nightly-junit.xml" 2>/dev/null
  tar czf "$OUT/reports.tgz" -C /tmp nightly mutant 2>/dev/null
  say "throughput: same scenarios on the mock (one core) and on cuda"
  timeout 150 python3 benchmarks/bench_backends.py --repeats 2 2>&1 | grep -v Warn | tee -a "$log"
else
  # The same scenarios on one GPU and on two (--max-examples with one seed:
  # the reference target finds nothing, so no run spends time shrinking),
  # with local workers, then over a local Ray instance where Ray imports.
  executors="local"
  python3 -c 'import ray' 2>/dev/null && executors="local ray" || say "ray is not installed here: the Ray runs are skipped"
  for ex in $executors; do
    for gpus in 0 0,1; do
      say "nightly campaign, --gpus $gpus, $ex workers, 3000 scenarios"
      # Ray picks each actor's GPU itself (no --gpus): the local instance sees only these.
      if [ "$ex" = ray ]; then where="--ray local --workers $(echo $gpus | tr ',' '\n' | wc -l)"; else where="--gpus $gpus"; fi
      CUDA_VISIBLE_DEVICES=$gpus timeout 280 python3 -m fuzz run --backend cuda $where --profile nightly --max-examples 3000 \
        --budget 240s --seed 7 --report-dir /tmp/scale-$ex-$gpus --quiet; echo "exit $?" | tee -a "$log"
      summary /tmp/scale-$ex-$gpus
    done
  done
  tar czf "$OUT/reports.tgz" -C /tmp $(cd /tmp && ls -d scale-* 2>/dev/null) 2>/dev/null
fi
say done
