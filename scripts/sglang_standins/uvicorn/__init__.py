"""Import-time stand-in for uvicorn.

Needed by: sglang/srt/distributed/gated_launch.py (`import uvicorn`), imported by
model_runner.py (the ModelRunner class cgsim's fake model runner subclasses).
Why a stand-in suffices: an ASGI server for gated multi-node launch; nothing is served.
"""
from _cgsim_standin import install

install(__name__)
