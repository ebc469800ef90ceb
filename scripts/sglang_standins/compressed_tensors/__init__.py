"""Import-time stand-in for compressed_tensors.

Needed by: sglang/srt/layers/quantization/compressed_tensors/compressed_tensors.py
(`from compressed_tensors.config import ...`), imported by the quantization registry
that model_runner / layers import.
Why a stand-in suffices: it describes quantized checkpoints; the toy model is not
quantized.
"""
from _cgsim_standin import install

install(__name__)
