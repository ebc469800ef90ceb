"""The documented vLLM encoder findings (docs/encoder.md, "What cgsim finds in
vLLM") as finding JSONs next to this script.

    PYTHONPATH=. python docs/encoder-findings/documented.py [--write]   # in a venv with vLLM

Runs each defect's scenario on ``--target vllm-encoder`` (the installed
release, or CGSIM_VLLM_SOURCE) and prints what the properties say; with
--write, each violation labelled with the scenario's defect is saved as
``<id>.json`` here (the campaign's own finding, built by
``cgsim.encoder.search.encoder_findings``), so that ``python -m fuzz replay``,
``python -m fuzz export-test`` and the tests have them at hand.
tests/cgsim/targets/vllm/test_vllm_encoder.py checks that the files are what this writes today.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from cgsim.encoder.values import (
    EncoderConfig,
    EncoderItem,
    EncoderScenario,
    EncoderStep,
)

HERE = os.path.dirname(os.path.abspath(__file__))

# (defect, its scenario): the launches docs/encoder.md's table gives.
SCENARIOS = (
    # A budget repeated in encoder_cudagraph_token_budgets, captured once per repetition.
    ("vllm-enc-1", EncoderScenario(EncoderConfig(token_budgets=(32, 32), max_num_batched_tokens=64),
                                   (EncoderStep("capture"),), "vllm-encoder-0.32")),
    # Three items per graph, frame slots max(3, 2) = 3; two videos of two frames are packed into one replay:
    # the fourth frame lands in the padding slot (a wrong output).
    ("vllm-enc-2", EncoderScenario(EncoderConfig(max_vision_items=3, max_frames_per_batch=2, min_budget=16,
                                                 max_num_batched_tokens=16),
                                   (EncoderStep("capture"), EncoderStep("encode", (EncoderItem(2, 2, 2, True),) * 2)),
                                   "vllm-encoder-0.32")),
    # The same graph, three videos of two frames: six frames do not fit the buffer at all (the copy raises).
    ("vllm-enc-2", EncoderScenario(EncoderConfig(max_vision_items=3, max_frames_per_batch=2, min_budget=16,
                                                 max_num_batched_tokens=16),
                                   (EncoderStep("capture"), EncoderStep("encode", (EncoderItem(2, 2, 2, True),) * 3)),
                                   "vllm-encoder-0.32")),
)


def documented_findings(target: Any = None, backend: str = "mock") -> list:
    """Each violation of each scenario that its defect explains, as the campaign's finding."""
    from cgsim.backends import get_backend
    from cgsim.encoder.observe import observe_encoder
    from cgsim.encoder.search import encoder_findings
    from cgsim.encoder.targets import encoder_target

    if target is None:
        target = encoder_target("vllm-encoder")
        target.prepare_environment()
    out = []
    for defect, sc in SCENARIOS:
        obs = observe_encoder(target, sc, get_backend(backend))
        for f in encoder_findings(target, obs, backend):
            if f.extra.get("known_defect") == defect and all(
                    g.property != f.property or g.extra.get("known_defect") != defect for g in out):
                out.append(f.with_(status="shrunk"))
    return out


def main(argv: list[str]) -> int:
    from cgsim.report.findings import write_finding

    for f in documented_findings():
        print(f"{f.extra['known_defect']}: {f.property} {f.id}: {f.message}")
        if "--write" in argv:  # without the environment: where it was written says nothing about the defect
            write_finding(HERE, dataclasses.replace(f, extra={k: v for k, v in f.extra.items() if k != "environment"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
