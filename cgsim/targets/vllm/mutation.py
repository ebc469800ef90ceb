"""One-line bugs put into vLLM's own modules as they are imported.

What an engineer's change to the tree looks like to cgsim, without writing
into the tree: ``CGSIM_VLLM_MUTATIONS`` (JSON: a list of {"module", "old",
"new"}) names lines of vLLM modules and what they become, and a
``sys.meta_path`` finder in front of the import system (and of a source tree
laid over the install) loads each named module from its own file with the
line replaced.  The variable travels to every process of a job, as
``CGSIM_VLLM_SOURCE`` does; tracebacks point at the module's file, whose line
numbers stay what they were.  A line that is not in the module exactly once
is a broken environment (exit 2), never a silent no-op.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from cgsim.targets import engine_mutation as _shared
from cgsim.targets.engine_mutation import Mutation

__all__ = ["MUTATIONS_ENV", "Mutation", "MUTATIONS", "SERVED_MUTATIONS", "MutationError", "install_from_environment",
           "environment_for", "in_tree"]

MUTATIONS_ENV = "CGSIM_VLLM_MUTATIONS"
CU = "vllm.v1.worker.gpu.cudagraph_utils"
ELASTIC = "vllm.distributed.elastic_ep.elastic_execute"
BLOCK_TABLE = "vllm.v1.worker.gpu.block_table"
DFLASH_CU = "vllm.v1.worker.gpu.spec_decode.dflash.cudagraph"
DFLASH_SPEC = "vllm.v1.worker.gpu.spec_decode.dflash.speculator"
DP_UTILS = "vllm.v1.worker.gpu.dp_utils"

# Bugs in the code every release 0.32-0.34 shares, the manager's and the paths
# around it the engine runs (the tests put each into the installed tree and
# require a campaign to report it).
MUTATIONS: tuple[Mutation, ...] = (
    Mutation(CU, "        and (desc.num_reqs is None or desc.num_reqs >= num_reqs)",
             "        and (desc.num_reqs is None or desc.num_reqs > num_reqs)",
             "compat-exact-reqs", bug="a graph captured for exactly the batch's requests is not compatible with it"),
    Mutation(CU, "        and desc.num_tokens >= num_tokens",
             "        and desc.num_tokens > num_tokens",
             "compat-exact-tokens", bug="a graph captured for exactly the batch's tokens is not compatible with it"),
    Mutation(CU, "            for mode in [CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL]:",
             "            for mode in [CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE]:",
             "full-captured-first", bug="FULL graphs are captured before the PIECEWISE ones"),
    Mutation(CU, "                        forward_fn = create_forward_fn(desc, warmup=False)",
             "                        forward_fn = forward_fn",
             "capture-reuses-warmup-state", bug="the capture reuses the warmup's inputs and attention metadata"),
    # Runner-level: the scale event's own release (elastic EP's _release_cuda_graphs), not the manager's code.
    Mutation(ELASTIC, "manager.release_graphs()", "manager.release_graphs",
             "scale-event-keeps-graphs", area="elastic EP scale event",
             bug="a scale event releases none of the model's graphs before capturing again"),
)


# Bugs in paths only the engine's own runner takes (found by the runner share's
# served scenarios, never by the manager-level search).
SERVED_MUTATIONS: tuple[Mutation, ...] = (
    # The pad program of the slot-mapping kernel gets an empty range, so a graph's padded tokens write the KV cache at
    # slots an earlier step left there (the kernel's own comment names the chunked-prefill case).
    *(Mutation(BLOCK_TABLE, f"_compute_slot_mappings_kernel[(num_groups, num_reqs + 1)](\n            {size},\n",
               "_compute_slot_mappings_kernel[(num_groups, num_reqs + 1)](\n            0,\n",
               "padded-slots-stale", area="input preparation",
               bug="padded tokens keep an earlier step's slot mappings and write the KV cache there")
      for size in ("slot_mappings.shape[1]",  # 0.26+
                   "self.max_num_batched_tokens")),  # 0.20-0.25
    # The draft model's decode graphs (the speculator's own manager) captured one draft step short: replayed, they
    # leave each request's last draft undrafted; greedy verification keeps the tokens, the drafts show it.
    *(Mutation(module, "                    else self.vllm_config.num_speculative_tokens\n",
               "                    else self.vllm_config.num_speculative_tokens - 1\n",
               "draft-decode-short", area="draft manager",
               bug="the draft model's decode graphs run one draft step short, so the last draft is never drafted")
      for module in ("vllm.v1.worker.gpu.spec_decode.target_dependent_ar.cudagraph_utils",  # 0.32-0.33
                     "vllm.v1.worker.gpu.spec_decode.autoregressive.cudagraph_utils")),  # 0.34
    # DFlash's query graphs (DFlashCudaGraphManager.capture) run the context step once as each graph is set up,
    # outside the captured forward: a replay stores no context K/V of its batch and its drafts read stale ones.
    Mutation(DFLASH_CU, "            def forward(cg_mode: CUDAGraphMode) -> None:\n"
                        "                prepare_forward(num_reqs, attn_metadata)\n",
             "            prepare_forward(num_reqs, attn_metadata)\n\n"
             "            def forward(cg_mode: CUDAGraphMode) -> None:\n",
             "dflash-context-outside-graph", area="DFlash draft manager",
             bug="the DFlash query graphs leave the context step out, so a replay drafts from stale context K/V"),
    # A FULL query graph stores only its first context rows: a step whose target tokens outnumber them (a
    # prefill) must store the rest before the replay (DFlashSpeculator.propose, 0.31+); skipped, they stay stale.
    Mutation(DFLASH_SPEC, "self._precompute_context_kv(num_context, num_target_tokens)\n", "pass\n",
             "dflash-context-beyond-graph-skipped", area="DFlash draft manager",
             bug="the context rows beyond a DFlash query graph's are not stored before its replay"),
    # Data-parallel ranks agree on one padded size, the largest rank's (sync_cudagraph_and_dp_padding, 0.32+): padded
    # to its own count instead, a busier rank replays a bigger graph than the others, whose captured expert
    # all-gathers then exchange other row counts (on a GPU a hang or mixed rows; on cgsim's gloo world a raise).
    Mutation(DP_UTILS, "    synced_num_tokens = int(num_tokens_across_dp.max())\n", "    synced_num_tokens = num_tokens\n",
             "dp-pads-to-own-count", area="data-parallel padding",
             bug="each data-parallel rank pads its batch to its own token count, not the largest rank's"),
)


def in_tree(mutations: Sequence[Mutation], vllm_location: str) -> tuple[Mutation, ...]:
    """Those of ``mutations`` whose module is a file of the vLLM package at
    ``vllm_location`` holding the row's line (a row per layout where releases
    moved the module or changed the line)."""
    def holds(m: Mutation) -> bool:
        path = os.path.join(vllm_location, *m.module.split(".")[1:]) + ".py"
        if not os.path.exists(path):
            return False
        with open(path) as f:
            return m.old in f.read()

    return tuple(m for m in mutations if holds(m))


class MutationError(RuntimeError):
    """A mutation does not apply to the module it names."""


def environment_for(mutations: Sequence[Mutation]) -> dict[str, str]:
    """The environment that puts ``mutations`` into a job's processes."""
    return _shared.environment_for(MUTATIONS_ENV, mutations)


def install_from_environment() -> tuple[Mutation, ...]:
    """Put the mutations CGSIM_VLLM_MUTATIONS names in front of the import
    system (once per process; before vLLM is imported)."""
    text = os.environ.get(MUTATIONS_ENV)
    if not text or _shared.installed(MUTATIONS_ENV):
        return ()
    try:
        mutations = tuple(Mutation.from_json(d) for d in json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise MutationError(f"{MUTATIONS_ENV} is not a JSON list of {{module, old, new}} ({exc})") from None
    _shared.install(MUTATIONS_ENV, mutations, MutationError)
    return mutations
