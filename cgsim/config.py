"""The manager config: everything candidate init and capture read (SPEC §2).

Validation raises ConfigError with the field, the value received and the fix,
so a bad --config file or a bad CLI flag produces one line a user can act on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any, TypeVar

from cgsim.engine_options import (EngineOptionsFormat, broken_entry_points, format_of_key, format_of_type,
                                  option_formats)
from cgsim.modes import AttentionSupport, CUDAGraphMode

__all__ = ["ConfigError", "ManagerConfig", "SpecSchedule", "dense_spec_schedule", "int_tuple"]

# (range_start, range_end, num_speculative_tokens), inclusive batch-size ranges.
SpecSchedule = tuple[tuple[int, int, int], ...]
Options = TypeVar("Options")


class ConfigError(ValueError):
    """A manager config value is invalid.  The message names field, value and fix."""

    def __init__(self, field_name: str, value: Any, problem: str, fix: str):
        self.field = field_name
        self.value = value
        super().__init__(f"config field '{field_name}' = {value!r}: {problem}; {fix}")


@dataclass(frozen=True)
class ManagerConfig:
    """Inputs of a CUDA-graph manager.

    ``mode`` is the *requested* mode; the manager resolves it against
    ``attention_support`` (SPEC §2).  ``decode_query_len`` is 1 + the number of
    speculative tokens.  ``spec_schedule`` enables dynamic speculative decoding:
    the scheduler picks the speculative-token count per batch size.
    ``num_ubatches`` > 1 enables micro-batching (DBO) for uniform batches of at
    least ``ubatch_threshold`` tokens.  ``engine_options``: each engine's own
    fields as one value of the options type it registers
    (``cgsim.engine_options``), at most one per type, read with
    ``options(Type)``; in the JSON each value's keys follow the shared fields.
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
    # Kept in the registry's order, so two configs with the same options are equal and write one JSON.
    engine_options: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("engine_options", _engine_options(self.engine_options))
        try:
            set_("mode", CUDAGraphMode.parse(self.mode))
        except ValueError as exc:
            raise ConfigError("mode", self.mode, "not a cudagraph mode", str(exc)) from None
        try:
            set_("attention_support", AttentionSupport.parse(self.attention_support))
        except ValueError as exc:
            raise ConfigError("attention_support", self.attention_support, "not a support level", str(exc)) from None
        set_("capture_sizes", int_tuple("capture_sizes", self.capture_sizes))
        set_("lora_cases", int_tuple("lora_cases", self.lora_cases))
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

    # -- engine options ------------------------------------------------------
    def options(self, options_type: type[Options]) -> Options | None:
        """This config's value of an engine's options type (None: it holds none)."""
        return next((v for v in self.engine_options if type(v) is options_type), None)

    def with_options(self, *values: Any) -> "ManagerConfig":
        """This config holding ``values``, each in place of its type's value (the others kept)."""
        given = {type(v) for v in values}
        return replace(self, engine_options=tuple(v for v in self.engine_options if type(v) not in given) + values)

    # -- JSON ------------------------------------------------------------------
    def to_json(self) -> dict:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "engine_options":
                # Each engine's keys at the top level, where they stood as config fields: old JSON unchanged.
                for options in v:
                    out.update(_format(type(options)).to_json(options))
                continue
            if isinstance(v, CUDAGraphMode):
                v = v.value
            elif isinstance(v, AttentionSupport):
                v = v.name
            elif f.name == "spec_schedule" and v is not None:
                v = [list(e) for e in v]
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
        shared = {f.name for f in fields(cls)} - {"engine_options"}
        unknown = sorted(k for k in data if k not in shared and format_of_key(k) is None)
        if unknown:
            known = shared | {k for f in option_formats() for k in f.json_keys}
            broken = "".join(f"; {line}" for line in broken_entry_points())
            raise ConfigError(unknown[0], data[unknown[0]], "is not a config field",
                              f"use only {', '.join(sorted(known))}{broken}")
        per_engine: dict[type, dict[str, Any]] = {}
        for key, value in data.items():
            if key not in shared and value is not None:  # an engine's key given as null is the key left out
                fmt = format_of_key(key)
                assert fmt is not None
                per_engine.setdefault(fmt.options_type, {})[key] = value
        values = tuple(_format(t).from_json(present) for t, present in per_engine.items())
        return cls(**{k: v for k, v in data.items() if k in shared}, engine_options=values)

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


def int_tuple(name: str, value: Any) -> tuple[int, ...]:
    """``value`` (a JSON list of whole numbers) as a tuple, or ConfigError naming the field ``name``."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ConfigError(name, value, "is not a list of integers", f"give {name} as a list, e.g. [1, 2, 4]")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(name, list(value), f"has the non-integer {v!r}", "use whole numbers")
        out.append(v)
    return tuple(out)


def _engine_options(value: Any) -> tuple[Any, ...]:
    """The engine options values in the registry's order, each of a registered type, one per type."""
    if not isinstance(value, (tuple, list)):
        raise ConfigError("engine_options", value, "is not a tuple of engine options values",
                          "give a tuple with one options value per engine, e.g. (Options(...),), or leave it out")
    if not value:
        return ()
    order = {f.options_type: i for i, f in enumerate(option_formats())}
    seen: set[type] = set()
    for v in value:
        if type(v) not in order:
            raise ConfigError("engine_options", v, f"is a {type(v).__name__}, no registered engine options type",
                              f"give values of {', '.join(t.__name__ for t in order)} "
                              "(an engine registers its type through cgsim.engine_options)")
        if type(v) in seen:
            raise ConfigError("engine_options", list(value), f"holds two {type(v).__name__} values",
                              "give each engine's options once")
        seen.add(type(v))
    return tuple(sorted(value, key=lambda v: order[type(v)]))


def _format(options_type: type) -> EngineOptionsFormat:
    fmt = format_of_type(options_type)
    assert fmt is not None, f"{options_type.__name__} is no registered engine options type"  # checked at construction
    return fmt


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
