"""Import-time stand-in for torchvision.

Needed by: sglang/srt/multimodal/internvl_utils.py (`import torchvision.transforms as T`),
reached from sglang.srt.configs; other multimodal processors import it too.
Why a stand-in suffices: image preprocessing for vision models only. Also, a real
torchvision wheel would drag in a CUDA torch or mismatch torch 2.13.0+cpu.
"""
from _cgsim_standin import install

install(__name__)
