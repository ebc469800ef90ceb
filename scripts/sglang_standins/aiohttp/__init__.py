"""Import-time stand-in for aiohttp.

Needed by: sglang/lang/backend/runtime_endpoint.py (`import aiohttp`), pulled in by
sglang/__init__.py; also HTTP helpers in sglang.srt.utils.
Why a stand-in suffices: an async HTTP client for talking to a running server
(aiohttp.ClientSession); the runners make no HTTP requests. The real one pulls in
multidict, yarl, frozenlist, aiosignal, propcache, aiohappyeyeballs.
"""
from _cgsim_standin import install

install(__name__)
