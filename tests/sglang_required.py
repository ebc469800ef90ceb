"""The one allowed skip of an sglang test module: sglang does not import in
this interpreter.  With CGSIM_REQUIRE_SGLANG=1 (CI's sglang environment)
sglang must be there, and a module that cannot import it fails instead."""

from __future__ import annotations

import os

import pytest


def require_sglang_or_skip() -> str:
    """The sglang version here; skips the calling test module where sglang does not import."""
    from cgsim.targets import TargetEnvironmentError
    from cgsim.targets.sglang import require_sglang

    try:
        return require_sglang()
    except TargetEnvironmentError as exc:
        if os.environ.get("CGSIM_REQUIRE_SGLANG") == "1":
            raise
        pytest.skip(f"sglang cannot run here ({exc})", allow_module_level=True)
