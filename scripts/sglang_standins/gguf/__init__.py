"""Import-time stand-in for gguf.

Needed by: sglang/srt/layers/quantization/gguf.py (`import gguf`), imported by the
quantization registry.
Why a stand-in suffices: reads GGUF checkpoints; none is loaded.
"""
from _cgsim_standin import install

install(__name__)
