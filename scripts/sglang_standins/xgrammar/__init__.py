"""Import-time stand-in for xgrammar.

Needed by: sglang/srt/function_call/inkling_detector.py and kimik3_detector.py
(`from xgrammar import StructuralTag`), which sglang 0.5.20 imports through
function_call_parser on the model runner's import chain.
Why a stand-in suffices: structural tags constrain tool-call decoding in the
grammar backend; the graph runners never build one.
"""
from _cgsim_standin import install

install(__name__)
