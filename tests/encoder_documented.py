"""The documented vLLM encoder findings as files (docs/encoder-findings/), shared by the vLLM encoder tests."""

from __future__ import annotations

import glob
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTED = sorted(glob.glob(os.path.join(ROOT, "docs", "encoder-findings", "*.json")))


def documented_module():
    """docs/encoder-findings/documented.py, which writes the files."""
    spec = importlib.util.spec_from_file_location(
        "encoder_findings_documented", os.path.join(ROOT, "docs", "encoder-findings", "documented.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
