"""Import-time stand-in for starlette.

Needed by: sglang/srt/utils/common.py (`from starlette.routing import Mount`) and
HTTP-server helpers (starlette.requests.Request, starlette.datastructures.Headers).
Why a stand-in suffices: only the HTTP server uses them; the graph runners never do.
"""
from _cgsim_standin import install

install(__name__)
