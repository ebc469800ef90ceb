"""The manager config: everything candidate init and capture read (SPEC §2).

Validation raises ConfigError with the field, the value received and the fix,
so a bad --config file or a bad CLI flag produces one line a user can act on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from cgsim.modes import AttentionSupport, CUDAGraphMode

__all__ = ["ConfigError", "ManagerConfig", "SglangOptions", "SpecSchedule", "dense_spec_schedule"]

# (range_start, range_end, num_speculative_tokens), inclusive batch-size ranges.
SpecSchedule = tuple[tuple[int, int, int], ...]


class ConfigError(ValueError):
    """A manager config value is invalid.  The message names field, value and fix."""

    def __init__(self, field_name: str, value: Any, problem: str, fix: str):
        self.field = field_name
        self.value = value
        super().__init__(f"config field '{field_name}' = {value!r}: {problem}; {fix}")


@dataclass(frozen=True)
class SglangOptions:
    """SGLang-only server options (``ManagerConfig.sglang``); every other target
    ignores them.  What the rest of the config means for SGLang is in
    ``cgsim.targets.sglang`` (capture_sizes -> cuda graph bs list, max_num_reqs
    -> request pool, decode_query_len -> verify width, num_ubatches=2 ->
    two-batch overlap).

    ``dp_size``: data-parallel attention ranks (attention TP 1), run as fake
    ranks in one process.  ``disable_padding``: --disable-cuda-graph-padding
    (only exactly captured sizes replay).  ``default_bs_list``: the decode bs
    list is SGLang's default ladder up to --cuda-graph-max-bs =
    max(capture_sizes) instead of capture_sizes itself.
    ``record_nolora_graph``: with LoRA, the LoRA backend skips inactive
    dense LoRA, so a base-only graph is recorded beside each LoRA graph.  ``full_prefill_max_req``: request slots of FULL prefill graphs
    (None: max_num_reqs).  ``eagle_topk`` / ``eagle_steps``: with EAGLE
    (decode_query_len > 1 draft tokens), --speculative-eagle-topk and
    --speculative-num-steps (None: decode_query_len - 1, a chain).
    """

    dp_size: int = 1
    disable_padding: bool = False
    default_bs_list: bool = False
    record_nolora_graph: bool = True
    full_prefill_max_req: int | None = None
    eagle_topk: int = 1
    eagle_steps: int | None = None

    def __post_init__(self) -> None:
        for name in ("disable_padding", "default_bs_list", "record_nolora_graph"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"sglang.{name}", getattr(self, name), "is not true or false", "use a JSON boolean")
        if isinstance(self.dp_size, bool) or not isinstance(self.dp_size, int) or self.dp_size < 1:
            raise ConfigError("sglang.dp_size", self.dp_size, "must be an integer >= 1",
                              "use 1 (no DP attention) or the number of DP attention ranks, e.g. 2")
        if isinstance(self.eagle_topk, bool) or not isinstance(self.eagle_topk, int) or self.eagle_topk < 1:
            raise ConfigError("sglang.eagle_topk", self.eagle_topk, "must be an integer >= 1",
                              "use 1 (chain drafts) or --speculative-eagle-topk, e.g. 2")
        st = self.eagle_steps
        if st is not None and (isinstance(st, bool) or not isinstance(st, int) or st < 1):
            raise ConfigError("sglang.eagle_steps", st, "must be an integer >= 1 or null",
                              "leave it null (decode_query_len - 1) or give --speculative-num-steps")
        fp = self.full_prefill_max_req
        if fp is not None and (isinstance(fp, bool) or not isinstance(fp, int) or fp < 1):
            raise ConfigError("sglang.full_prefill_max_req", fp, "must be an integer >= 1 or null",
                              "leave it null (max_num_reqs) or give the request slots of FULL prefill graphs")

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Any) -> "SglangOptions":
        if isinstance(data, SglangOptions):
            return data
        if not isinstance(data, dict):
            raise ConfigError("sglang", data, "is not a JSON object",
                              "give an object such as {\"dp_size\": 2} or leave the field out")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"sglang.{unknown[0]}", data[unknown[0]], "is not an SGLang option",
                              f"use only {', '.join(sorted(known))}")
        return cls(**data)


# A field added after configs were first written: left out of the JSON while None.
_JSON_OMITS_NONE = {"json_omits_none": True}


@dataclass(frozen=True)
class ManagerConfig:
    """Inputs of a CUDA-graph manager.

    ``mode`` is the *requested* mode; the manager resolves it against
    ``attention_support`` (SPEC §2).  ``decode_query_len`` is 1 + the number of
    speculative tokens.  ``spec_schedule`` enables dynamic speculative decoding:
    the scheduler picks the speculative-token count per batch size.
    ``num_ubatches`` > 1 enables micro-batching (DBO) for uniform batches of at
    least ``ubatch_threshold`` tokens.
    """

    mode: CUDAGraphMode = CUDAGraphMode.FULL_AND_PIECEWISE
    capture_sizes: tuple[int, ...] = (1, 2, 4, 8)
    max_num_reqs: int = 8
    max_capture_size: int | None = None
    decode_query_len: int = 1
    spec_schedule: SpecSchedule | None = None
    lora_cases: tuple[int, ...] = (0,)
    breakable: bool = False
    varlen_decode: bool = False
    num_ubatches: int = 1
    ubatch_threshold: int = 32
    attention_support: AttentionSupport = AttentionSupport.ALWAYS
    attention_split: bool = True
    compiled_piecewise: bool = True
    # Request counts of the uniform decode graphs where the engine sizes them
    # apart from the token sizes (vLLM 0.34+: decode_cudagraph_capture_request_sizes);
    # None: the design derives them from capture_sizes (and the JSON leaves it out).
    decode_sizes: tuple[int, ...] | None = field(default=None, metadata=_JSON_OMITS_NONE)
    # SGLang-only options; None for every other target (and left out of the JSON).
    sglang: SglangOptions | None = field(default=None, metadata=_JSON_OMITS_NONE)

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        if self.sglang is not None:
            set_("sglang", SglangOptions.from_json(self.sglang))
        try:
            set_("mode", CUDAGraphMode.parse(self.mode))
        except ValueError as exc:
            raise ConfigError("mode", self.mode, "not a cudagraph mode", str(exc)) from None
        try:
            set_("attention_support", AttentionSupport.parse(self.attention_support))
        except ValueError as exc:
            raise ConfigError("attention_support", self.attention_support, "not a support level", str(exc)) from None
        set_("capture_sizes", _int_tuple("capture_sizes", self.capture_sizes))
        set_("lora_cases", _int_tuple("lora_cases", self.lora_cases))
        if self.decode_sizes is not None:
            set_("decode_sizes", _int_tuple("decode_sizes", self.decode_sizes))
        if self.spec_schedule is not None:
            set_("spec_schedule", _schedule_tuple(self.spec_schedule))
        self._validate()
        if self.max_capture_size is None:
            set_("max_capture_size", max(self.capture_sizes))

    # -- validation --------------------------------------------------------
    def _validate(self) -> None:
        sizes = self.capture_sizes
        if not sizes:
            raise ConfigError("capture_sizes", list(sizes), "is empty", "give at least one positive batch size, e.g. [1, 2, 4, 8]")
        bad = [s for s in sizes if s <= 0]
        if bad:
            raise ConfigError("capture_sizes", list(sizes), f"has non-positive sizes {bad}", "use only sizes >= 1")
        if len(set(sizes)) != len(sizes):
            raise ConfigError("capture_sizes", list(sizes), "has duplicates", "list each size once")
        ds = self.decode_sizes
        if ds is not None and (any(s < 1 for s in ds) or len(set(ds)) != len(ds)):
            raise ConfigError("decode_sizes", list(ds), "must be distinct request counts >= 1",
                              "list each decode graph's request count once, or leave it out")
        if self.max_num_reqs < 1:
            raise ConfigError("max_num_reqs", self.max_num_reqs, "must be >= 1", "set it to the scheduler's max_num_seqs (e.g. 256)")
        if self.decode_query_len < 1:
            raise ConfigError("decode_query_len", self.decode_query_len, "must be >= 1", "use 1 without speculative decoding, or 1 + num_speculative_tokens")
        if self.max_capture_size is not None and self.max_capture_size < max(sizes):
            raise ConfigError(
                "max_capture_size", self.max_capture_size,
                f"is below the largest capture size {max(sizes)}",
                "raise it to at least max(capture_sizes) or drop the larger sizes",
            )
        if self.max_capture_size is not None and self.max_capture_size < 1:
            raise ConfigError("max_capture_size", self.max_capture_size, "must be >= 1", "leave it unset to use max(capture_sizes)")
        if 0 not in self.lora_cases:
            raise ConfigError("lora_cases", list(self.lora_cases), "does not contain 0", "add 0 (the no-LoRA case), e.g. [0, 1, 2, 4]")
        if any(c < 0 for c in self.lora_cases):
            raise ConfigError("lora_cases", list(self.lora_cases), "has negative cases", "use counts >= 0")
        if len(set(self.lora_cases)) != len(self.lora_cases):
            raise ConfigError("lora_cases", list(self.lora_cases), "has duplicates", "list each case once")
        if self.num_ubatches < 1:
            raise ConfigError("num_ubatches", self.num_ubatches, "must be >= 1", "use 1 (no micro-batching) or 2 (DBO)")
        if self.ubatch_threshold < 1:
            raise ConfigError("ubatch_threshold", self.ubatch_threshold, "must be >= 1", "use the DBO token threshold, e.g. 32")
        if self.varlen_decode and self.attention_support != AttentionSupport.ALWAYS:
            raise ConfigError(
                "varlen_decode", True,
                f"varlen decode graphs replay batches of mixed query lengths, which needs attention support ALWAYS "
                f"(declared: {self.attention_support.name})",
                "turn varlen_decode off or use an attention backend that supports any batch in a full graph",
            )
        if self.spec_schedule is not None:
            self._validate_schedule()

    def _validate_schedule(self) -> None:
        sched = self.spec_schedule
        assert sched is not None
        if not sched:
            raise ConfigError("spec_schedule", [], "is empty", "give (range_start, range_end, num_spec_tokens) entries starting at batch size 1, or leave it unset")
        if self.decode_query_len < 2:
            raise ConfigError("spec_schedule", [list(e) for e in sched], "is set but decode_query_len is 1 (no speculative decoding)", "set decode_query_len to 1 + the maximum number of speculative tokens")
        previous_end = 0
        for start, end, k in sched:
            if start < 1 or end < start:
                raise ConfigError("spec_schedule", [list(e) for e in sched], f"has the bad range ({start}, {end})", "each range needs 1 <= range_start <= range_end")
            if k < 0:
                raise ConfigError("spec_schedule", [list(e) for e in sched], f"has a negative token count {k}", "use num_speculative_tokens >= 0")
            if start <= previous_end:
                raise ConfigError("spec_schedule", [list(e) for e in sched], "is unsorted or has overlapping ranges", "sort the ranges by range_start and make them disjoint")
            previous_end = end
        if sched[0][0] != 1:
            raise ConfigError("spec_schedule", [list(e) for e in sched], "does not start at batch size 1", "make the first range start at 1 so every batch size has a schedule")

    # -- derived -------------------------------------------------------------
    @property
    def num_speculative_tokens(self) -> int:
        return self.decode_query_len - 1

    @property
    def piecewise_available(self) -> bool:
        return self.compiled_piecewise or self.breakable

    @cached_property
    def _dense_schedule(self) -> tuple[int, ...]:
        # Computed once: every request count asks it (up to max_num_reqs of them).
        return tuple(dense_spec_schedule(self.spec_schedule, self.max_num_reqs, self.num_speculative_tokens))

    def scheduler_decode_query_len(self, num_reqs: int) -> int:
        """The query length the scheduler gives each request of a pure-decode
        batch of ``num_reqs`` requests (dynamic speculative decoding aware)."""
        if self.spec_schedule is None:
            return self.decode_query_len
        return 1 + self._dense_schedule[min(num_reqs, self.max_num_reqs)]

    @cached_property
    def scheduler_decode_limits(self) -> dict[int, int]:
        """Each decode query length -> the most requests a pure decode of it has."""
        if self.spec_schedule is None:
            return {self.decode_query_len: self.max_num_reqs}
        return {1 + k: r for r, k in enumerate(self._dense_schedule) if r > 0}

    @cached_property
    def _longest_decode(self) -> tuple[int, ...]:
        # Index n: the longest decode length of any batch of at least n requests.
        if self.spec_schedule is None:
            return (self.decode_query_len,) * (self.max_num_reqs + 1)
        longest, out = 0, []
        for k in reversed(self._dense_schedule[1:]):
            longest = max(longest, 1 + k)
            out.append(longest)
        return (out[-1], *reversed(out))

    def scheduler_longest_decode_len(self, num_reqs: int) -> int:
        """The longest query length a request of a pure decode of
        ``num_reqs`` requests can have: the schedule's length for a batch of
        at least as many requests (the drafts a request verifies were
        chosen for the batch of the step before, which may have been
        larger)."""
        return self._longest_decode[min(num_reqs, self.max_num_reqs)]

    def scheduler_decode_query_lens(self) -> tuple[int, ...]:
        """Every decode query length the scheduler can produce, sorted."""
        if self.spec_schedule is None:
            return (self.decode_query_len,)
        return tuple(sorted({1 + k for k in self._dense_schedule[1:]}))

    def with_(self, **changes: Any) -> "ManagerConfig":
        return replace(self, **changes)

    # -- JSON ------------------------------------------------------------------
    def to_json(self) -> dict:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, CUDAGraphMode):
                v = v.value
            elif isinstance(v, AttentionSupport):
                v = v.name
            elif f.name == "spec_schedule" and v is not None:
                v = [list(e) for e in v]
            elif v is None and f.metadata.get("json_omits_none"):
                continue  # a later optional part: configs without it keep their JSON
            elif hasattr(v, "to_json"):
                v = v.to_json()
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out

    @classmethod
    def from_json(cls, data: Any) -> "ManagerConfig":
        if not isinstance(data, dict):
            raise ConfigError("<config>", data, "is not a JSON object", "give an object such as {\"mode\": \"FULL_AND_PIECEWISE\", \"capture_sizes\": [1, 2, 4]}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(unknown[0], data[unknown[0]], "is not a config field", f"use only {', '.join(sorted(known))}")
        return cls(**data)

    @classmethod
    def load(cls, path: str) -> "ManagerConfig":
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except OSError as exc:
            raise ConfigError("--config", path, f"cannot be read ({exc.strerror})", "pass a readable JSON file") from None
        except json.JSONDecodeError as exc:
            raise ConfigError("--config", path, f"is not valid JSON ({exc.msg} at line {exc.lineno})", "fix the JSON syntax") from None
        return cls.from_json(data)


def _int_tuple(name: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ConfigError(name, value, "is not a list of integers", f"give {name} as a list, e.g. [1, 2, 4]")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(name, list(value), f"has the non-integer {v!r}", "use whole numbers")
        out.append(v)
    return tuple(out)


def _schedule_tuple(value: Any) -> SpecSchedule:
    try:
        entries = tuple(tuple(int(x) for x in e) for e in value)
    except (TypeError, ValueError):
        raise ConfigError("spec_schedule", value, "is not a list of (range_start, range_end, num_spec_tokens)", "give e.g. [[1, 8, 3], [9, 64, 1]]") from None
    if any(len(e) != 3 for e in entries):
        raise ConfigError("spec_schedule", value, "has an entry that is not 3 numbers", "give each entry as [range_start, range_end, num_spec_tokens]")
    return entries


def dense_spec_schedule(schedule: SpecSchedule, max_batch_size: int, max_spec_tokens: int) -> list[int]:
    """batch size -> speculative tokens, index 0 unused.  Gaps between ranges
    carry the previous count forward, the tail carries the last; every count is
    clamped to the configured maximum (what the scheduler applies)."""
    dense = [0] * (max_batch_size + 1)
    last = None
    ranges = iter(schedule)
    current = next(ranges, None)
    for b in range(1, max_batch_size + 1):
        while current is not None and b > current[1]:
            last = current[2]
            current = next(ranges, None)
        if current is not None and current[0] <= b <= current[1]:
            k = current[2]
        elif last is not None:
            k = last
        else:
            k = current[2] if current is not None else 0
        dense[b] = min(max_spec_tokens, k)
    return dense
