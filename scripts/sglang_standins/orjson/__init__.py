"""Import-time stand-in for orjson.

Needed by: sglang/srt/utils/common.py (`import orjson`) and API/IO modules.
Why a stand-in suffices: fast JSON for HTTP responses and metrics dumps; the runners
serialise nothing.
"""
from _cgsim_standin import install

install(__name__)
