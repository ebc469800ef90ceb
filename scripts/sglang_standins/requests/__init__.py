"""Import-time stand-in for requests.

Needed by: sglang/srt/utils/common.py (`import requests`) and HTTP helpers (download,
health checks) on the import chain.
Why a stand-in suffices: the runners make no HTTP requests. Spares requests, urllib3,
idna, charset-normalizer and certifi.
"""
from _cgsim_standin import install

install(__name__)
