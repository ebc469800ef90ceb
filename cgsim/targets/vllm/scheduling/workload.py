"""A request trace for vLLM's scheduler: which requests arrive when, how
long their prompts and outputs are, which LoRA adapter each uses, how many
of their drafts the target model accepts, and how small the KV cache is.

Plain frozen values: Hypothesis draws them (``fuzz.strategies``) and
shrinks them to a short trace; ``random_workload`` makes a seeded one for
long runs.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

__all__ = ["RequestSpec", "Workload", "random_workload"]


@dataclass(frozen=True)
class RequestSpec:
    """One request: it arrives before engine step ``arrival_step``.

    ``prefix``: how many leading prompt tokens it shares with every other
    request of the same ``prefix_group`` (prefix-cache hits; group 0 shares
    nothing).  ``lora``: the adapter id (0: the base model)."""

    arrival_step: int
    prompt_len: int
    output_len: int
    lora: int = 0
    prefix_group: int = 0
    prefix: int = 0

    def __post_init__(self) -> None:
        if self.arrival_step < 0 or self.prompt_len < 1 or self.output_len < 1 or self.lora < 0:
            raise ValueError(f"a request needs arrival_step >= 0, prompt_len >= 1, output_len >= 1 and lora >= 0, "
                             f"got {self}")
        if not 0 <= self.prefix <= self.prompt_len:
            raise ValueError(f"a request's shared prefix must lie within its prompt, got {self}")


@dataclass(frozen=True)
class Workload:
    """Requests, how the target model accepts drafts, and the engine
    settings only the scheduler reads.

    ``acceptance``: the chance that each draft token is accepted, given the
    ones before it were (the verification stops at the first rejection).
    ``kv_tokens``: the KV cache's capacity in tokens (``--num-gpu-blocks-override``
    of as many blocks as hold it, block sizes differ between releases; None:
    a cache no trace fills).
    ``async_scheduling``: None keeps what vLLM picks for the launch."""

    requests: tuple[RequestSpec, ...]
    acceptance: float = 0.7
    kv_tokens: int | None = None
    async_scheduling: bool | None = None
    seed: int = 0
    max_steps: int = 100_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", tuple(self.requests))
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"acceptance is a probability, got {self.acceptance}")
        if self.kv_tokens is not None and self.kv_tokens < 1:
            raise ValueError(f"kv_tokens must be >= 1 or None, got {self.kv_tokens}")

    def to_json(self) -> dict:
        return {"requests": [dataclasses.asdict(r) for r in self.requests], "acceptance": self.acceptance,
                "kv_tokens": self.kv_tokens, "async_scheduling": self.async_scheduling, "seed": self.seed,
                "max_steps": self.max_steps}

    @classmethod
    def from_json(cls, data: dict) -> "Workload":
        return cls(tuple(RequestSpec(**r) for r in data["requests"]), data["acceptance"], data["kv_tokens"],
                   data["async_scheduling"], data["seed"], data["max_steps"])


def random_workload(seed: int, num_requests: int = 64, loras: int = 0, kv_tokens: int | None = None,
                    acceptance: float | None = None, async_scheduling: bool | None = None,
                    max_prompt: int = 600, max_output: int = 120, context_limit: int | None = None) -> Workload:
    """A seeded request mix: bursts and lulls of arrivals, short and long
    prompts (chunked prefills), a share of prompts with a common prefix
    (prefix-cache hits, some leaving one token to compute), LoRA adapters
    1..``loras`` on about half the requests, and with ``context_limit`` (the
    launch's max_model_len) a few requests that end exactly there."""
    rng = random.Random(seed)
    step, reqs = 0, []
    for _ in range(num_requests):
        step += rng.choice((0, 0, 0, 1, 1, 2, 5, 20))
        prompt = rng.choice((1, 2, rng.randint(1, 32), rng.randint(1, max_prompt)))
        group, prefix = 0, 0
        if prompt > 16 and rng.random() < 0.3:
            group = rng.randint(1, 3)
            # Whole blocks, or whole blocks and one token: a prompt that is all
            # prefix then has one token left to compute over the cached blocks.
            prefix = min(prompt, rng.choice((16, 32, 48)) + rng.choice((0, 1)))
        lora = rng.randint(1, loras) if loras and rng.random() < 0.5 else 0
        output = rng.randint(1, max_output)
        if context_limit is not None and rng.random() < 0.05:
            # Its last decodes verify fewer drafts: the scheduler stops a request at max_model_len.
            prompt, group, prefix = context_limit - output, 0, 0
        reqs.append(RequestSpec(step, prompt, output, lora, group, prefix))
    p = acceptance if acceptance is not None else rng.choice((0.0, 0.5, 0.8, 1.0))
    return Workload(tuple(reqs), p, kv_tokens, async_scheduling, seed)
