"""vLLM's own scheduler over engine-like launches, every batch checked
against cgsim's model of producible batches (cgsim.targets.vllm.scheduling).

    PYTHONPATH=. python benchmarks/vllm_scheduler_survey.py [--min-batches 10000] [--json out.json]
    CGSIM_VLLM_SOURCE=/path/to/vllm-0.34.0 PYTHONPATH=. python benchmarks/vllm_scheduler_survey.py
    PYTHONPATH=. python benchmarks/vllm_scheduler_survey.py --finding F.json [--min-batches 2000]

``--finding``: the launch of a finding's config instead (did vLLM's
scheduler produce the batches the finding's claim is about?).

Per launch: the batches scheduled, what they exercised, the batches outside
the model, and per request count the schedule's decode length, the longest
decode the scheduler produced and the model's bound (longest_decode_len).
Exit 0 when every batch is in the model, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from cgsim.config import ManagerConfig
from cgsim.report.findings import load_finding
from cgsim.spec.scheduler import decode_query_len, longest_decode_len
from cgsim.targets.vllm.compat import require_vllm
from cgsim.targets.vllm.scheduling.survey import SurveyCase, summary, survey


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-batches", type=int, default=10_000)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--finding", help="survey this finding's config instead of the built-in launches")
    args = ap.parse_args(argv)
    caps = require_vllm()
    if args.finding:
        config = ManagerConfig.from_json(load_finding(args.finding).scenario["config"])
        results = survey(args.min_batches, cases=(SurveyCase.of(os.path.basename(args.finding), config),))
    else:
        results = survey(args.min_batches)
    exercised, misses = summary(results)
    print(f"vLLM {caps.version}: {exercised.batches} scheduled batches, {len(misses)} outside cgsim's model")
    rows = []
    for r in results:
        print(f"\n{r.case}: {r.launch}")
        print(f"  {asdict(r.check.exercised)}")
        for m in r.check.misses[:5]:
            print(f"  MISS {m.batch.to_json()}: {m.reason}")
        bounds = [(n, decode_query_len(r.config, n), q, longest_decode_len(r.config, n)) for n, q in r.check.longest_decodes]
        print("  requests: schedule's length / longest scheduled / model's bound  "
              + "  ".join(f"{n}: {s}/{q}/{m}" for n, s, q, m in bounds))
        rows.append({"case": r.case, "launch": r.launch, "exercised": asdict(r.check.exercised),
                     "misses": [{"batch": m.batch.to_json(), "reason": m.reason} for m in r.check.misses],
                     "decodes": [{"requests": n, "schedule": s, "longest": q, "model": m} for n, s, q, m in bounds]})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"vllm": caps.version, "results": rows}, fh, indent=1)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
