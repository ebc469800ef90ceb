"""Import-time stand-in for regex: the standard library's re under regex's name.

Needed by: sglang/srt/layers/quantization/modelopt_quant.py (`import regex as re`) and
other quantization / parser modules on the runner's import chain.
Why a stand-in suffices: nothing compiles a pattern at import time; the patterns
those modules build later (checkpoint layer-name globs, chat parsing) are never
built by the graph runners.
"""
from re import *  # noqa: F401,F403
from re import error  # noqa: F401
