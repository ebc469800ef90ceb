"""vLLM's model-runner-V2 CUDA-graph managers as a cgsim target.

Modules: ``target`` (the family, environment and self-check hooks),
``handle`` (the manager handle and the model runner's stand-ins), ``compat``
(capabilities by introspection, designs, process patches), ``source`` (a
source tree laid over the install), ``known`` (the documented defects),
``doctor`` (the self-check), ``coverage`` (which vLLM lines a campaign ran).
"""

from cgsim.targets.vllm.handle import (
    VllmAdapterError,
    VllmManagerHandle,
    build_vllm_config,
    from_vllm_desc,
    from_vllm_mode,
    to_vllm_desc,
    to_vllm_mode,
)
from cgsim.targets.vllm.target import FAMILY, VllmTarget

__all__ = ["FAMILY", "VllmTarget", "VllmManagerHandle", "VllmAdapterError", "build_vllm_config", "to_vllm_mode",
           "from_vllm_mode", "from_vllm_desc", "to_vllm_desc"]
