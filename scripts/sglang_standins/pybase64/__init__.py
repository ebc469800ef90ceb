"""Import-time stand-in for pybase64.

Needed by: sglang/srt/utils/common.py (`import pybase64`).
Why a stand-in suffices: base64-decodes images/embeddings in API requests; never called
by the runners.
"""
from _cgsim_standin import install

install(__name__)
