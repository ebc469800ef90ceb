"""SGLang's own config fields (``ManagerConfig.engine_options``, cgsim.engine_options).

How the shared fields read for SGLang, and these options with them:
``cgsim.spec.sglang``.  A config without ``SglangOptions`` leaves the
``sglang`` key out of its JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from cgsim.config import ConfigError
from cgsim.engine_options import EngineOptionsFormat

__all__ = ["SglangOptions", "OPTIONS_FORMAT"]


@dataclass(frozen=True)
class SglangOptions:
    """SGLang-only server options; every other target ignores them.  The JSON
    keeps them as the object ``sglang`` at the config's top level.  What the
    rest of the config means for SGLang is in ``cgsim.targets.sglang``
    (capture_sizes -> cuda graph bs list, max_num_reqs -> request pool,
    decode_query_len -> verify width, num_ubatches=2 -> two-batch overlap).

    ``dp_size``: data-parallel attention ranks (attention TP 1), run as fake
    ranks in one process.  ``disable_padding``: --disable-cuda-graph-padding
    (only exactly captured sizes replay).  ``default_bs_list``: the decode bs
    list is SGLang's default ladder up to --cuda-graph-max-bs =
    max(capture_sizes) instead of capture_sizes itself.
    ``record_nolora_graph``: with LoRA, the LoRA backend skips inactive
    dense LoRA, so a base-only graph is recorded beside each LoRA graph.
    ``full_prefill_max_req``: request slots of FULL prefill graphs
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
        if not isinstance(data, dict):
            raise ConfigError("sglang", data, "is not a JSON object",
                              "give an object such as {\"dp_size\": 2} or leave the field out")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"sglang.{unknown[0]}", data[unknown[0]], "is not an SGLang option",
                              f"use only {', '.join(sorted(known))}")
        return cls(**data)


def _to_json(options: SglangOptions) -> dict[str, Any]:
    return {"sglang": options.to_json()}


def _from_json(present: dict[str, Any]) -> SglangOptions:
    return SglangOptions.from_json(present["sglang"])


OPTIONS_FORMAT = EngineOptionsFormat(SglangOptions, ("sglang",), _to_json, _from_json)
