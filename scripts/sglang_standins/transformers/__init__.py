"""Import-time stand-in for transformers.

Needed by: sglang/srt/configs/*.py (108 modules `from transformers import
PretrainedConfig` and subclass it), sglang/srt/utils/hf_transformers_utils.py and
model files, all imported through sglang.srt.configs / model_config on the runner's
import chain.
Why a stand-in suffices: cgsim's fake ModelRunner carries its own tiny
model_config; no HF config, tokenizer or model is ever loaded. The real package
(~60 MB with huggingface_hub, tokenizers, safetensors, hf-xet, regex, pyyaml) is
spared.
"""
from _cgsim_standin import install

install(__name__, __version__="5.19.0")


class PretrainedConfig(__getattr__("PretrainedConfig")):
    # sglang/srt/utils/hf_transformers_patches.py (run by `import sglang`) walks these
    __class_validators__ = []


PreTrainedConfig = PretrainedConfig
