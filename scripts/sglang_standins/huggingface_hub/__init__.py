"""Import-time stand-in for huggingface_hub.

Needed by: sglang/srt/utils/hf_transformers/common.py (`from huggingface_hub import
snapshot_download`) and model-loader modules on the import chain.
Why a stand-in suffices: it downloads model files from the Hub; cgsim loads
no model (and nothing may be downloaded here).
"""
from _cgsim_standin import install

install(__name__)
