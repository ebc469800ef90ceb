"""Import-time stand-in for sentencepiece.

Needed by: sglang/srt/configs/internvl.py (`import sentencepiece as spm`), reached from
sglang.srt.configs.
Why a stand-in suffices: a tokenizer library for one model family's tokenizer; no
tokenizer is built by the runners.
"""
from _cgsim_standin import install

install(__name__)
