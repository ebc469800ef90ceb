"""Import-time stand-in for pillow (PIL).

Needed by: sglang/srt/utils/common.py (`from PIL import Image, ImageOps,
UnidentifiedImageError`) and multimodal config modules (configs/janus_pro.py,
deepseekvl2.py, ...) pulled in by sglang.srt.configs at import time.
Why a stand-in suffices: images are only decoded when serving multimodal requests;
the cgsim sglang target never touches an image.
"""
from _cgsim_standin import install


class UnidentifiedImageError(OSError):
    pass


install(__name__)
