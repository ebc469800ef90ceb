"""Import-time stand-in for fastapi.

Needed by: sglang/srt/distributed/gated_launch.py (`from fastapi import FastAPI`),
imported by model_runner.py (the ModelRunner class cgsim's fake model runner subclasses).
Why a stand-in suffices: the gated-launch HTTP endpoint; nothing is served.
"""
from _cgsim_standin import install

install(__name__)
