"""Batch descriptors (captured or dispatched shapes), scheduler batches and
their compatibility (SPEC §2)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Iterable

from cgsim.modes import CUDAGraphMode

__all__ = ["BatchDescriptor", "Batch", "BatchShape", "lora_case"]


@dataclass(frozen=True)
class BatchDescriptor:
    """A batch shape a graph is captured for, or that dispatch picked.

    ``num_reqs`` None means no request padding is needed (the graph does not
    depend on the request count); ``uniform_token_count`` None means any
    per-request length; ``max_query_len`` None means unconstrained.
    """

    cg_mode: CUDAGraphMode
    num_tokens: int
    num_reqs: int | None = None
    uniform_token_count: int | None = None
    max_query_len: int | None = None
    num_active_loras: int = 0
    num_ubatches: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.cg_mode, CUDAGraphMode):
            object.__setattr__(self, "cg_mode", CUDAGraphMode.parse(self.cg_mode))

    @property
    def is_uniform_decode(self) -> bool:
        return self.uniform_token_count is not None

    def to_json(self) -> dict:
        return {
            "cg_mode": self.cg_mode.value,
            "num_tokens": self.num_tokens,
            "num_reqs": self.num_reqs,
            "uniform_token_count": self.uniform_token_count,
            "max_query_len": self.max_query_len,
            "num_active_loras": self.num_active_loras,
            "num_ubatches": self.num_ubatches,
        }

    @classmethod
    def from_json(cls, data: dict) -> "BatchDescriptor":
        return cls(**data)

    def short(self) -> str:
        parts = [f"{self.cg_mode.value}", f"tokens={self.num_tokens}"]
        if self.num_reqs is not None:
            parts.append(f"reqs={self.num_reqs}")
        if self.uniform_token_count is not None:
            parts.append(f"uniform={self.uniform_token_count}")
        if self.max_query_len is not None:
            parts.append(f"max_q={self.max_query_len}")
        if self.num_active_loras:
            parts.append(f"loras={self.num_active_loras}")
        if self.num_ubatches != 1:
            parts.append(f"ubatches={self.num_ubatches}")
        return "Desc(" + " ".join(parts) + ")"


@dataclass(frozen=True)
class Batch:
    """What the scheduler hands the runner: per-request query lengths, the number
    of distinct active LoRA adapters, the micro-batch count and whether any
    request is prefilling.

    A batch with a prefill is not eligible for decode graphs (vLLM's runner
    passes uniform_token_count=None and max_query_len=None for it), whatever
    its shape: two 2-token prompt chunks are not a decode of length 2.
    """

    query_lens: tuple[int, ...]
    num_active_loras: int = 0
    num_ubatches: int = 1
    has_prefill: bool = False

    def __post_init__(self) -> None:
        # map/min rather than generator expressions: checks build batches of hundreds of requests by the thousand.
        object.__setattr__(self, "query_lens", tuple(map(int, self.query_lens)))
        if not self.query_lens:
            raise ValueError("a batch needs at least one request (query_lens is empty)")
        if min(self.query_lens) < 1:
            raise ValueError(f"every query length must be >= 1, got {list(self.query_lens)}")
        if self.num_active_loras < 0:
            raise ValueError(f"num_active_loras must be >= 0, got {self.num_active_loras}")
        if self.num_ubatches < 1:
            raise ValueError(f"num_ubatches must be >= 1, got {self.num_ubatches}")

    @classmethod
    def uniform(cls, num_reqs: int, query_len: int, **kw) -> "Batch":
        return cls((query_len,) * num_reqs, **kw)

    # Derived once per batch (a batch is frozen; dispatch asks these often).
    @cached_property
    def num_reqs(self) -> int:
        return len(self.query_lens)

    @cached_property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @cached_property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def decode_max_query_len(self) -> int | None:
        """The max_query_len dispatch sees: None for a batch with a prefill."""
        return None if self.has_prefill else self.max_query_len

    @cached_property
    def uniform_token_count(self) -> int | None:
        """The common per-request length of a decode batch; None with a prefill."""
        if self.has_prefill:
            return None
        first = self.query_lens[0]
        return first if all(q == first for q in self.query_lens) else None

    @property
    def kind(self) -> str:
        """A coarse label for coverage statistics."""
        if self.has_prefill:
            return "single-prefill" if self.num_reqs == 1 else "mixed-prefill"
        return "uniform-decode" if self.uniform_token_count is not None else "varlen-decode"

    def to_json(self) -> dict:
        return {
            "query_lens": list(self.query_lens),
            "num_active_loras": self.num_active_loras,
            "num_ubatches": self.num_ubatches,
            "has_prefill": self.has_prefill,
        }

    @classmethod
    def from_json(cls, data: dict) -> "Batch":
        return cls(tuple(data["query_lens"]), data.get("num_active_loras", 0), data.get("num_ubatches", 1),
                   bool(data.get("has_prefill", False)))

    @property
    def shape(self) -> "BatchShape":
        return BatchShape(self.num_reqs, self.num_tokens, self.max_query_len, self.uniform_token_count,
                          self.has_prefill, self.num_active_loras, self.num_ubatches)

    def short(self) -> str:
        lens = list(self.query_lens)
        shown = lens if len(lens) <= 8 else lens[:8] + ["..."]
        extra = ""
        if self.num_active_loras:
            extra += f" loras={self.num_active_loras}"
        if self.num_ubatches != 1:
            extra += f" ubatches={self.num_ubatches}"
        if self.has_prefill:
            extra += " prefill"
        return f"Batch(reqs={self.num_reqs} tokens={self.num_tokens} query_lens={shown}{extra})"


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What a dispatcher sees of a batch: its counts, not its requests.

    It stands for every batch with these counts; the dispatch sweep asks a
    manager about shapes (dispatch reads nothing else) and never runs them.
    ``max_query_len`` is the longest request (for a batch with a prefill the
    longest it can be: one prompt chunk beside one-token decodes), which is
    what a graph's captured metadata must cover.
    """

    num_reqs: int
    num_tokens: int
    max_query_len: int
    uniform_token_count: int | None  # None: a prefill, or decode lengths that differ
    has_prefill: bool
    num_active_loras: int = 0
    num_ubatches: int = 1

    @property
    def decode_max_query_len(self) -> int | None:
        return None if self.has_prefill else self.max_query_len

    @property
    def kind(self) -> str:
        if self.has_prefill:
            return "single-prefill" if self.num_reqs == 1 else "mixed-prefill"
        return "uniform-decode" if self.uniform_token_count is not None else "varlen-decode"

    def example(self) -> Batch:
        """A concrete batch of this shape (for a replayable step)."""
        r, t, m = self.num_reqs, self.num_tokens, self.max_query_len
        if self.uniform_token_count is not None:
            lens: tuple[int, ...] = (self.uniform_token_count,) * r
        else:
            rest = t - m
            base, extra = divmod(rest, r - 1) if r > 1 else (0, 0)
            lens = (m,) + (base + 1,) * extra + (base,) * (r - 1 - extra)
        return Batch(lens, self.num_active_loras, self.num_ubatches, has_prefill=self.has_prefill)

    def short(self) -> str:
        what = (f"uniform={self.uniform_token_count}" if self.uniform_token_count is not None
                else f"max_q={self.max_query_len}")
        extra = ""
        if self.num_active_loras:
            extra += f" loras={self.num_active_loras}"
        if self.num_ubatches != 1:
            extra += f" ubatches={self.num_ubatches}"
        if self.has_prefill:
            extra += " prefill"
        return f"Batch(reqs={self.num_reqs} tokens={self.num_tokens} {what}{extra})"

    def to_json(self) -> dict:
        return {"num_reqs": self.num_reqs, "num_tokens": self.num_tokens, "max_query_len": self.max_query_len,
                "uniform_token_count": self.uniform_token_count, "has_prefill": self.has_prefill,
                "num_active_loras": self.num_active_loras, "num_ubatches": self.num_ubatches}

    @classmethod
    def from_json(cls, data: dict) -> "BatchShape":
        return cls(**{k: data[k] for k in ("num_reqs", "num_tokens", "max_query_len", "uniform_token_count",
                                           "has_prefill", "num_active_loras", "num_ubatches")})


def lora_case(num_active_loras: int, lora_cases: Iterable[int]) -> int:
    """Map an active LoRA count to the captured case that serves it: the smallest
    case >= the count, clamped to the largest case."""
    return _lora_case(num_active_loras, tuple(lora_cases))


@lru_cache(maxsize=4096)
def _lora_case(num_active_loras: int, lora_cases: tuple[int, ...]) -> int:
    # Cached: dispatch asks this for every batch of a sweep.
    cases = sorted(set(lora_cases))
    if not cases:
        raise ValueError("lora_cases is empty; it must contain at least 0")
    for case in cases:
        if case >= num_active_loras:
            return case
    return cases[-1]
