"""The SGLang part of the agreement corpus: sglang's own decode and prefill
CUDA-graph runners on the CPU mock and on real CUDA graphs must give the same
verdicts, the same dispatch decisions (steps and sweeps) and, within
OUTPUT_ATOL, the same replayed rows.

    python tests/agreement/sglang_agreement.py make             # where sglang imports: record on the mock
    python tests/agreement/sglang_agreement.py check --backend cuda [--jobs 8] [--json OUT]

``make`` writes tests/agreement/sglang_corpus.jsonl: the runner backends
(full and breakable decode and prefill runners, each mode sglang has a
launch for) x (plain, LoRA with and without base-only graphs, verify graphs,
EAGLE's draft decode and draft extend runners, two-batch overlap, padding
disabled, the default bs ladder, FULL prefill request slots) and DP
attention configs the installed release accepts, plus the documented
findings (docs/sglang-findings/*.json, cgsim.targets.sglang.known).
``check`` runs every entry in a fresh child process forked from a parent
that imported sglang once (engine_agreement.py, shared with the vLLM part).
A disagreement is a mock or adapter bug to fix, never an sglang finding.
"""

from __future__ import annotations

import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(os.path.dirname(HERE)) not in sys.path:  # run as a script
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from tests.agreement.engine_agreement import ROOT, main as _main  # noqa: E402

CORPUS = os.path.join(HERE, "sglang_corpus.jsonl")
SIZES = (1, 2, 4, 8)

# Option sets per mode: what each exercises in the runners.
VARIANTS = {
    "plain": dict(),
    "lora": dict(lora_cases=(0, 2), sglang=dict(record_nolora_graph=True)),
    "lora-base": dict(lora_cases=(0, 2), sglang=dict(record_nolora_graph=False)),
    "verify": dict(decode_query_len=3),
    "tbo": dict(num_ubatches=2, ubatch_threshold=2, capture_sizes=(2, 4, 8)),
    "tbo-verify": dict(num_ubatches=2, ubatch_threshold=2, decode_query_len=2, capture_sizes=(2, 4, 8)),
    "nopad": dict(sglang=dict(disable_padding=True)),
    "nopad-tbo": dict(num_ubatches=2, ubatch_threshold=2, capture_sizes=(2, 4), sglang=dict(disable_padding=True)),
    "ladder": dict(capture_sizes=(1, 16), max_num_reqs=6, sglang=dict(default_bs_list=True)),
    "lora-verify": dict(lora_cases=(0, 1), decode_query_len=2),
    # EAGLE's draft decode and draft extend runners (a full decode runner builds them).
    "eagle-chain": dict(decode_query_len=4),
    "eagle-topk2": dict(decode_query_len=4, sglang=dict(eagle_topk=2, eagle_steps=3)),
    "eagle-nopad": dict(decode_query_len=3, capture_sizes=(1, 2, 4), sglang=dict(disable_padding=True)),
    "eagle-odd-pool": dict(decode_query_len=3, capture_sizes=(1, 3, 5), max_num_reqs=3),
}
# The runner backend pairs whose decode graphs capture: decode full alone, with a
# breakable or a full prefill runner (both breakable, documented defect 1, and none: EXTRA).
MODES = ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", "FULL")
# DP attention (the driver's DP ranks run plain decode graphs, no prefill runner).
DP = {
    "dp2": dict(sglang=dict(dp_size=2)),
    "dp3": dict(sglang=dict(dp_size=3), max_num_reqs=5),
    "dp2-nopad": dict(sglang=dict(dp_size=2, disable_padding=True)),
    "dp2-ladder": dict(capture_sizes=(1, 8), max_num_reqs=5, sglang=dict(dp_size=2, default_bs_list=True)),
}
EXTRA = {
    "FULL-slots2": dict(mode="FULL", sglang=dict(full_prefill_max_req=2)),
    "FULL-slots1-lora": dict(mode="FULL", lora_cases=(0, 1), sglang=dict(full_prefill_max_req=1)),
    "FULL_AND_PIECEWISE-odd-pool": dict(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 3, 5), max_num_reqs=3),
    "PIECEWISE-plain": dict(mode="PIECEWISE"),
    "FULL-tbo-lora": dict(mode="FULL", num_ubatches=2, ubatch_threshold=2, capture_sizes=(2, 4), lora_cases=(0, 2)),
    "PIECEWISE-verify": dict(mode="PIECEWISE", decode_query_len=2),
    "NONE-plain": dict(mode="NONE"),
    "FULL_DECODE_ONLY-nopad-tbo-odd-pool": dict(mode="FULL_DECODE_ONLY", num_ubatches=2, ubatch_threshold=2,
                                                capture_sizes=(2, 4), max_num_reqs=3,
                                                sglang=dict(disable_padding=True)),
    "FULL_AND_PIECEWISE-no-breakable": dict(mode="FULL_AND_PIECEWISE", compiled_piecewise=False),
}


def _config(**kw):
    from cgsim.config import ManagerConfig
    from cgsim.spec.sglang_options import SglangOptions

    kw = dict(kw)
    options = SglangOptions(**kw.pop("sglang", {}))
    base = dict(capture_sizes=SIZES, max_num_reqs=4)
    base.update(kw)
    q = base.get("decode_query_len", 1)
    sizes, pool = base["capture_sizes"], base["max_num_reqs"]
    # Decode graphs hold bs x width tokens: batches and the sweep reach them all.
    base.setdefault("max_capture_size", max(max(sizes), min(max(sizes), pool + 1) * q))
    return ManagerConfig(engine_options=(options,), **base)


def configs() -> list[tuple[str, object]]:
    out = []
    for mode in MODES:
        for name, kw in VARIANTS.items():
            out.append((f"{mode}-{name}", _config(mode=mode, **kw)))
    for name, kw in DP.items():
        out.append((f"FULL_DECODE_ONLY-{name}", _config(mode="FULL_DECODE_ONLY", **kw)))
    for name, kw in EXTRA.items():
        out.append((name, _config(**kw)))
    return out


def steps_for(config) -> tuple:
    """make_corpus's lifecycle (decodes and extends around a capture, a
    release and a recapture), its request counts cut to the request pool."""
    from cgsim.descriptors import Batch
    from cgsim.scenario import Step

    q, pool = config.decode_query_len, config.max_num_reqs
    loras = max(config.lora_cases)
    ub = 2 if config.num_ubatches == 2 else 1
    decode = lambda r: Batch((config.scheduler_decode_query_len(min(r, pool)),) * min(r, pool))  # noqa: E731
    n = min(4, pool)
    return (
        Step.dispatch(decode(2)),
        Step.capture(),
        Step.dispatch(decode(1)),
        Step.dispatch(decode(3)),
        Step.dispatch(Batch((3, 1, 2)[:pool], has_prefill=True)),
        Step.dispatch(Batch((5,), num_active_loras=loras, has_prefill=True)),
        Step.dispatch(Batch((q,) * n, num_ubatches=ub if n * q >= max(config.ubatch_threshold, 2) else 1)),
        Step.release(),
        Step.dispatch(Batch((1,) * min(2, pool))),
        Step.capture(),
        Step.dispatch(Batch((2, 1)[:pool], has_prefill=True)),
        Step.dispatch(decode(4)),
    )


def entries_to_record() -> list[tuple[str, dict]]:
    from cgsim.scenario import Scenario
    from cgsim.targets.sglang import compat

    ruleset = compat.probe().ruleset
    out = []
    for name, config in configs():
        scenario = Scenario(config, steps_for(config), ruleset=ruleset)
        out.append((f"sglang/{name}", scenario.to_json()))
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "sglang-findings", "*.json"))):
        finding = json.load(open(path, encoding="utf-8"))
        out.append((f"sglang/finding/{finding['id']}", finding["scenario"]))
    return out


def main(argv: list[str] | None = None) -> int:
    return _main(argv, __doc__, CORPUS, "sglang", "SGLang", entries_to_record)


if __name__ == "__main__":
    sys.exit(main())
