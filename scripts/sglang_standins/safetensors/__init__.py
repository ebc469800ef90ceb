"""Import-time stand-in for safetensors.

Needed by: sglang/srt/connector/serde/safe_serde.py (`from safetensors.torch import
load, save`) and weight-loader modules on the import chain.
Why a stand-in suffices: reads/writes checkpoint files; no weights are loaded.
"""
from _cgsim_standin import install

install(__name__)
