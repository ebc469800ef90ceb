"""Hypothesis strategies for request traces that vLLM's own scheduler runs
(``cgsim.targets.vllm.scheduling``): a failure shrinks to a few short
requests arriving together, every draft accepted, vLLM's own KV cache and
scheduling mode."""

from __future__ import annotations

from hypothesis import strategies as st

from cgsim.targets.vllm.scheduling.workload import RequestSpec, Workload

__all__ = ["request_specs", "workloads"]


@st.composite
def request_specs(draw, loras: int = 0, max_model_len: int = 4096, max_prompt: int = 300,
                  max_output: int = 24) -> RequestSpec:
    """One request: prompts of one token up to chunked ones, a cached prefix
    (the group's first tokens), an adapter, or a request that ends at
    ``max_model_len`` (its last decodes verify fewer drafts)."""
    arrival = draw(st.integers(0, 20))
    output = draw(st.integers(1, max_output))
    if draw(st.integers(0, 9)) == 0:
        return RequestSpec(arrival, max_model_len - output, output)
    prompt = draw(st.integers(1, max_prompt))
    group = draw(st.integers(0, 2))
    prefix = draw(st.integers(0, prompt)) if group else 0
    lora = draw(st.integers(0, loras))
    return RequestSpec(arrival, prompt, output, lora, group, prefix)


@st.composite
def workloads(draw, max_requests: int = 8, loras: int = 0, max_model_len: int = 4096) -> Workload:
    """A trace of 1 to ``max_requests`` requests, an acceptance rate, a KV
    cache of vLLM's size or one that holds little more than one
    ``max_model_len`` request (preemptions), and the scheduling mode vLLM
    picks or sync scheduling."""
    requests = draw(st.lists(request_specs(loras, max_model_len), min_size=1, max_size=max_requests))
    acceptance = draw(st.sampled_from((1.0, 0.0, 0.5, 0.8)))
    # Room for one max_model_len request and its drafts' slots: vLLM starts with no less.
    kv_tokens = draw(st.one_of(st.none(), st.integers(max_model_len + 256, 2 * max_model_len)))
    async_scheduling = draw(st.sampled_from((None, False)))
    return Workload(tuple(requests), acceptance, kv_tokens, async_scheduling, draw(st.integers(0, 3)))
