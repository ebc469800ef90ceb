"""A cgsim config as the ``python -m sglang.launch_server`` line a user types,
validated by sglang's own code.

``launch_for`` writes the server flags a config stands for (the CUDA-graph
backends and batch sizes, the request pool, speculative decoding, LoRA, two-
batch overlap, DP attention, padding).  ``engine_graph_config`` hands them to
the installed sglang: its argument parser (``ServerArgs.add_cli_args``,
choices and types), ``ServerArgs.from_cli_args``, the resolution pipeline's
model-independent checks (``resolve_once`` with ``--model-path dummy``, where
sglang itself stops before loading a model), ``handle_cuda_graph_config``,
which builds the ``CudaGraphConfig`` the runners read, and the start-up check
a launch runs next (``ServerArgs.check_server_args``: two-batch overlap's
requirement of attention DP or an all-to-all MoE backend, the LoRA checks,
...), given the fields it reads that the dummy-model path leaves unset
(``compat.VALIDATION_INPUTS``, each with why).  A launch sglang refuses is
``TargetUnsupported`` with sglang's own reason: counted by a campaign, never
judged.  An exception of another kind from the check is cgsim failing to
present what it reads (``SglangAdapterError``, exit 2), never a refusal.
Checks that need the model's config (architecture rules, memory sizing) are
not run: no model is loaded here.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from cgsim.config import ManagerConfig
from cgsim.spec import sglang as rules
from cgsim.targets.base import TargetUnsupported
from cgsim.targets.sglang.compat import SglangAdapterError, validation_inputs
from cgsim.text import first_line

__all__ = ["SglangLaunch", "launch_for", "engine_graph_config", "MODEL", "DRAFT_MODEL"]

MODEL = "MODEL"  # the user's model; graph capture does not depend on which
DRAFT_MODEL = "DRAFT_MODEL"
LORA_RANK = 16  # the adapters' largest rank; graph capture does not depend on it
_BACKEND_FLAG = {rules.FULL_BACKEND: "full", rules.BREAKABLE: "breakable", rules.DISABLED: "disabled"}


@dataclass(frozen=True)
class SglangLaunch:
    """The server flags a config stands for (``args``: after ``--model-path MODEL``)."""

    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(a) for a in ("python", "-m", "sglang.launch_server", "--model-path", MODEL,
                                                *self.args))
        return f"{env} {cmd}".strip()

    def to_json(self) -> dict:
        return {"line": self.line(), "args": list(self.args), "env": dict(self.env)}


def launch_for(config: ManagerConfig) -> SglangLaunch:
    """The flags that reach ``config`` (cgsim.spec.sglang's reading of a config)."""
    opts = rules.options(config)
    decode, prefill = rules.runner_backends(config)
    args: list[str] = ["--cuda-graph-backend-decode", _BACKEND_FLAG[decode],
                       "--cuda-graph-backend-prefill", _BACKEND_FLAG[prefill]]
    if opts.default_bs_list:
        args += ["--cuda-graph-max-bs-decode", str(max(config.capture_sizes))]
    else:
        args += ["--cuda-graph-bs-decode", *map(str, config.capture_sizes)]
    args += ["--cuda-graph-bs-prefill", *map(str, config.capture_sizes)]
    if prefill == rules.FULL_BACKEND and opts.full_prefill_max_req is not None:
        # Only the JSON form sets the slots; JSON wins over the per-phase flags, so it repeats them.
        args += ["--cuda-graph-config", json.dumps({"prefill": {
            "backend": "full", "bs": list(config.capture_sizes), "full_prefill_max_req": opts.full_prefill_max_req}},
            separators=(",", ":"))]
    args += ["--max-running-requests", str(config.max_num_reqs)]
    if opts.disable_padding:
        args.append("--disable-cuda-graph-padding")
    if config.num_ubatches == 2:
        args.append("--enable-two-batch-overlap")
    if opts.dp_size > 1:
        args += ["--enable-dp-attention", "--dp-size", str(opts.dp_size), "--tp-size", str(opts.dp_size)]
    if config.decode_query_len > 1:
        q = config.decode_query_len
        args += ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", DRAFT_MODEL,
                 "--speculative-num-draft-tokens", str(q), "--speculative-num-steps",
                 str(rules.eagle_steps(config)), "--speculative-eagle-topk", str(rules.eagle_topk(config))]
    k = rules.lora_case_of(config)
    if k:
        # The LoRA backend that skips inactive dense LoRA (record_nolora_graph) is triton_v2.  Without
        # --lora-paths sglang needs the adapters' shape up front (lora_hook.check_lora_server_args):
        # a rank and the target modules ("all": resolved against the model when it loads).
        args += ["--enable-lora", "--max-loras-per-batch", str(k), "--lora-backend",
                 "triton_v2" if opts.record_nolora_graph else "triton", "--max-lora-rank", str(LORA_RANK),
                 "--lora-target-modules", "all"]
    return SglangLaunch(tuple(args))


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """sglang's parser, raising where it would print usage and exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Refused(message)


@functools.lru_cache(maxsize=4096)
def _graph_config(args: tuple[str, ...]) -> Any:
    server_args_mod = importlib.import_module("sglang.srt.server_args")
    parser = _Parser(prog="sglang serve")
    server_args_mod.ServerArgs.add_cli_args(parser)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            raw = parser.parse_args(["--model-path", "dummy", *args])
            server_args = server_args_mod.ServerArgs.from_cli_args(raw)
            server_args.resolve_once()
            hook = importlib.import_module("sglang.srt.arg_groups.cuda_graph_hook")
            run_hook = importlib.import_module("sglang.srt.arg_groups.resolution_hooks").run_hook
            run_hook(hook.handle_cuda_graph_config, server_args)
    except _Refused as exc:
        return ("refused", f"its argument parser: {first_line(exc, 240)}")
    except (ValueError, AssertionError, TypeError, KeyError, NotImplementedError, RuntimeError) as exc:
        return ("refused", f"{type(exc).__name__}: {first_line(exc, 240)}")
    graph_config = importlib.import_module("sglang.srt.arg_groups.overrides").resolving_view(
        server_args).cuda_graph_config
    # What the launch does next (entrypoints/engine.py: resolve_once, then check_server_args).
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            validation_inputs(server_args)
            server_args.check_server_args()
    except (ValueError, AssertionError) as exc:
        return ("refused", f"check_server_args: {type(exc).__name__}: {first_line(exc, 240)}")
    except Exception as exc:  # noqa: BLE001 - not a refusal: cgsim did not give the check what it reads
        raise SglangAdapterError(
            f"sglang's check_server_args failed on what cgsim gave it ({type(exc).__name__}: {first_line(exc, 200)}; "
            f"cgsim.targets.sglang.compat.VALIDATION_INPUTS): {' '.join(args)}") from None
    return ("built", graph_config)


def engine_graph_config(config: ManagerConfig, version: str) -> Any:
    """The CudaGraphConfig sglang builds from the launch that reaches ``config``;
    TargetUnsupported with sglang's reason where it refuses the launch."""
    launch = launch_for(config)
    logger = __import__("logging").getLogger("sglang")
    level = logger.level
    logger.setLevel(50)  # sglang warns about experimental settings while resolving; cgsim records its verdict
    try:
        verdict, value = _graph_config(launch.args)
    finally:
        logger.setLevel(level)
    if verdict == "refused":
        raise TargetUnsupported(f"sglang {version} refuses the launch ({value}): {launch.line()}")
    return value
