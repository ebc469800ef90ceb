"""Import-time stand-in for einops.

Needed by: sglang/srt/eplb/expert_distribution.py (`import einops`), imported by
model_runner / MoE layers.
Why a stand-in suffices: tensor rearranging for expert-load statistics (EPLB); the
toy model has no experts.
"""
from _cgsim_standin import install

install(__name__)
