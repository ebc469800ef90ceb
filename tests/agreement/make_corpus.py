"""Regenerate the agreement corpus: Scenarios that must give the same verdicts,
the same dispatch decisions and (within OUTPUT_ATOL) the same replayed outputs
on the CPU mock and on real CUDA graphs.

    python tests/agreement/make_corpus.py      # rewrites tests/agreement/corpus.jsonl

Each line: {"id", "target", "scenario", "expected": {"violations", "dispatch"}},
the expectation recorded on the mock.  Coverage: every mode, both rulesets,
breakable on/off, LoRA, speculative decoding (fixed and dynamic schedules),
micro-batching, and every mutant.
"""

from __future__ import annotations

import itertools
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.descriptors import Batch  # noqa: E402
from cgsim.modes import AttentionSupport as S, CUDAGraphMode as M  # noqa: E402
from cgsim.scenario import Scenario, Step  # noqa: E402
from cgsim.targets.mutants import MUTANTS  # noqa: E402

from tests.agreement.observe import observe  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus.jsonl")

VARIANTS = {
    "plain": dict(),
    "lora": dict(lora_cases=(0, 1, 2)),
    "spec": dict(decode_query_len=3),
    "dyn-spec": dict(decode_query_len=3, spec_schedule=((1, 2, 2), (3, 8, 1))),
    "dbo": dict(num_ubatches=2, ubatch_threshold=4, capture_sizes=(2, 4, 8, 12)),
    "varlen": dict(decode_query_len=2, varlen_decode=True),
}


def steps_for(config: ManagerConfig) -> tuple[Step, ...]:
    q = config.decode_query_len
    loras = max(config.lora_cases)
    ub = config.num_ubatches if config.num_ubatches > 1 else 1
    decode = lambda r: Batch((config.scheduler_decode_query_len(r),) * r)  # noqa: E731
    return (
        Step.dispatch(decode(2)),
        Step.capture(),
        Step.dispatch(decode(1)),
        Step.dispatch(decode(3)),
        Step.dispatch(Batch((3, 1, 2), has_prefill=True)),
        Step.dispatch(Batch((5,), num_active_loras=loras, has_prefill=True)),
        Step.dispatch(Batch((q,) * 4, num_ubatches=ub if 4 * q >= max(config.ubatch_threshold, 2) else 1)),
        Step.release(),
        Step.dispatch(Batch((1, 1))),
        Step.capture(),
        Step.dispatch(Batch((2, 1), has_prefill=True)),
        Step.dispatch(decode(4)),
    )


def configs():
    for mode, breakable, (vname, extra) in itertools.product(M, (False, True), VARIANTS.items()):
        support = S.UNIFORM_BATCH if breakable else S.ALWAYS
        if vname == "varlen":
            support = S.ALWAYS
        kw = dict(mode=mode, capture_sizes=(1, 2, 4, 8), max_num_reqs=4, breakable=breakable,
                  attention_support=support)
        kw.update(extra)
        yield f"{mode.value}-{'brk' if breakable else 'cmp'}-{vname}", ManagerConfig(**kw)


def record(entry_id: str, target: str, scenario: Scenario) -> dict:
    seen = observe({"scenario": scenario.to_json(), "target": target}, "mock")
    return {
        "id": entry_id,
        "target": target,
        "scenario": scenario.to_json(),
        "expected": {"violations": seen["violations"], "dispatch": seen["dispatch"], "sweeps": seen["sweeps"]},
    }


def main() -> None:
    entries = []
    for (name, config), ruleset in itertools.product(list(configs()), ("pr48822", "vllm-0.32")):
        scenario = Scenario(config, steps_for(config), ruleset=ruleset)
        entries.append(record(f"reference/{name}/{ruleset}", "reference", scenario))
    mutant_configs = [
        ManagerConfig(mode=M.FULL_AND_PIECEWISE, capture_sizes=(1, 2, 4, 8), max_num_reqs=4, breakable=True,
                      attention_support=S.UNIFORM_BATCH, lora_cases=(0, 1, 2)),
        ManagerConfig(mode=M.PIECEWISE, capture_sizes=(2, 4, 8), max_num_reqs=4, breakable=True,
                      attention_support=S.UNIFORM_BATCH),
        ManagerConfig(mode=M.FULL, capture_sizes=(1, 2, 4, 8), max_num_reqs=4),
        ManagerConfig(mode=M.FULL_DECODE_ONLY, capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=2,
                      lora_cases=(0, 2)),
        ManagerConfig(mode=M.FULL_AND_PIECEWISE, capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3,
                      spec_schedule=((1, 2, 2), (3, 8, 1))),
        ManagerConfig(mode=M.FULL, capture_sizes=(2, 4, 8, 12), max_num_reqs=4, num_ubatches=2, ubatch_threshold=4),
    ]
    for mutant in sorted(MUTANTS):
        for i, config in enumerate(mutant_configs):
            ruleset = "pr48822" if i % 2 == 0 else "vllm-0.32"
            scenario = Scenario(config, steps_for(config), ruleset=ruleset)
            entries.append(record(f"mutant/{mutant}/{i}/{ruleset}", f"mutant:{mutant}", scenario))
    with open(CORPUS, "w", encoding="utf-8") as fh:
        for e in entries:
            fh.write(json.dumps(e, sort_keys=True) + "\n")
    print(f"wrote {len(entries)} scenarios to {CORPUS}")


if __name__ == "__main__":
    main()
