"""The one allowed skip of a vLLM test module: vLLM is not importable in this
interpreter.  With CGSIM_REQUIRE_VLLM=1 (CI's vLLM environments) vLLM must be
there, and a module that cannot import it fails instead."""

from __future__ import annotations

import os

import pytest


def skip_unless_vllm() -> None:
    """Skip the calling test module where vLLM does not import here."""
    if os.environ.get("CGSIM_REQUIRE_VLLM", "") not in ("", "0"):
        return
    try:
        from cgsim.targets.vllm.compat import require_vllm

        require_vllm()
    except Exception as exc:  # noqa: BLE001 - whatever keeps vLLM from importing
        pytest.skip(f"vLLM is not importable here ({type(exc).__name__}: {exc}); run in a vllm tox env "
                    "(vllm-0.20 ... vllm-0.34)", allow_module_level=True)
