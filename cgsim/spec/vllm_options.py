"""vLLM's own config fields (``ManagerConfig.engine_options``, cgsim.engine_options).

``decode_sizes``: the request counts of the uniform decode graphs, where the
engine sizes them apart from the token sizes (vLLM 0.34+:
``decode_cudagraph_capture_request_sizes``).  A config without a
``VllmOptions`` has none: the design derives them from ``capture_sizes``
(``Ruleset.decode_shapes``), and the JSON leaves the key out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cgsim.config import ConfigError, ManagerConfig, int_tuple
from cgsim.engine_options import EngineOptionsFormat

__all__ = ["VllmOptions", "OPTIONS_FORMAT", "decode_sizes_of"]


@dataclass(frozen=True)
class VllmOptions:
    """vLLM-only options; every other engine ignores them.  The JSON keeps
    ``decode_sizes`` at the config's top level, as it was written before."""

    decode_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        sizes = int_tuple("decode_sizes", self.decode_sizes)
        if any(s < 1 for s in sizes) or len(set(sizes)) != len(sizes):
            raise ConfigError("decode_sizes", list(sizes), "must be distinct request counts >= 1",
                              "list each decode graph's request count once, or leave it out")
        object.__setattr__(self, "decode_sizes", sizes)


def decode_sizes_of(config: ManagerConfig) -> tuple[int, ...] | None:
    """The config's decode graph request counts (None: derived from its capture sizes)."""
    options = config.options(VllmOptions)
    return None if options is None else options.decode_sizes


def _to_json(options: VllmOptions) -> dict[str, Any]:
    return {"decode_sizes": list(options.decode_sizes)}


def _from_json(present: dict[str, Any]) -> VllmOptions:
    return VllmOptions(decode_sizes=present["decode_sizes"])


OPTIONS_FORMAT = EngineOptionsFormat(VllmOptions, ("decode_sizes",), _to_json, _from_json)
