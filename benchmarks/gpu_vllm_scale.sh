#!/usr/bin/env bash
# A nightly-sized vLLM campaign on the lent GPU machine's CPU cores (the mock
# backend, many workers), and what each finding it reports is: its documented
# defect, whether vLLM's own config path builds the finding's recorded launch
# into the manager config the finding judges (engine.check_launch), and what
# vLLM's own model runner, built from that launch at the campaign's end, said.
# Run from the repository root there, carrying .gpu and .whl/vllm as
# benchmarks/gpu_vllm.sh does; a second tree, optional, is laid over the first
# with --vllm-source (.gpu/vllm-<version>-src.tar.xz: an unpacked `vllm` wheel's
# Python, made on a machine with network).
#
#   bash benchmarks/gpu_vllm_scale.sh OUTDIR WORKERS BUDGET [SOURCE_TARBALL]
#
# OUTDIR gets scale.log and summary.json (the campaign's).
set -u
OUT=${1:?OUTDIR}; WORKERS=${2:?WORKERS}; BUDGET=${3:?BUDGET}; SRC=${4:-}
mkdir -p "$OUT"
log="$OUT/scale.log"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
if [ ! -d /tmp/vllm-tree/vllm ]; then
  rm -rf /tmp/site /tmp/vllm-tree && mkdir -p /tmp/vllm-tree
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/vllm/*.whl \
    2>&1 | tail -2 | tee -a "$log"
  tar -xJf "$(ls .gpu/vllm-*-tree.tar.xz | head -1)" -C /tmp/vllm-tree
fi
export PYTHONPATH=/tmp/site:/tmp/vllm-tree:.
source_args=()
if [ -n "$SRC" ]; then
  dest=/tmp/src-$(basename "$SRC" .tar.xz)
  [ -d "$dest" ] || { mkdir -p "$dest" && tar -xJf "$SRC" -C "$dest"; }
  source_args=(--vllm-source "$(ls -d "$dest"/*/ | head -1)")
fi
echo "== $(nproc) cores; campaign --workers $WORKERS --budget $BUDGET ${source_args[*]}" | tee -a "$log"
rm -rf /tmp/scale-reports
timeout 590 python3 -m fuzz run --target vllm --workers "$WORKERS" --force-workers --budget "$BUDGET" --seed 1 \
  "${source_args[@]}" --report-dir /tmp/scale-reports --quiet > "$OUT/campaign.log" 2>&1
echo "campaign exit $? (0 clean, 1 findings, 2 environment)" | tee -a "$log"
cp /tmp/scale-reports/latest/summary.json "$OUT/summary.json" 2>/dev/null
CGSIM_VLLM_SOURCE="${source_args[1]:-}" python3 - <<'PY' 2>&1 | grep -v "WARNING\|INFO" | tee -a "$log"
import json
from cgsim.scenario import Scenario
from cgsim.targets.base import TargetUnsupported
from cgsim.targets.vllm.compat import require_vllm
from cgsim.targets.vllm.engine import EngineLaunch, check_launch

caps = require_vllm()
d = json.load(open("/tmp/scale-reports/latest/summary.json"))
refused = sum((d.get("coverage", {}).get("not_reachable") or {}).values())
print(f"vLLM {caps.version}: scenarios={d['scenarios']} findings={len(d['findings'])} refused={refused}")
for note in d.get("notes", []):
    if note.startswith(("runner share", "runner confirmation")):
        print(f"  note: {note}")
for f in d["findings"]:
    launch = f.get("launch") or {}
    try:
        check_launch(EngineLaunch.of(launch["toy_model"], launch["args"], launch["env"]),
                     Scenario.from_json(f["scenario"]).config)
        built = "launch builds it"
    except (TargetUnsupported, KeyError) as exc:
        built = f"LAUNCH DOES NOT BUILD IT: {str(exc)[:160]}"
    said = f.get("runner_confirmation") or {}
    runner = f"vLLM's runner: {said.get('verdict', 'not asked')}" + (f" ({said['detail'][:100]})" if said.get("detail") else "")
    print(f"  {f['property']}: {f.get('known_defect') or 'NOT DOCUMENTED'}; {built}; {runner}; {f['message'][:110]}")
print(f"manager-level only (the runner never builds what they name): {len(d.get('manager_level', []))}")
PY
