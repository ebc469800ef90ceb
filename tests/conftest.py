import os

import pytest
from hypothesis import settings

import cgsim.profiles  # noqa: F401  (registers dev / ci / nightly before --hypothesis-profile is read)

# Without --hypothesis-profile the quick local profile applies (no deadline: a
# first capture in a process is slow and hangs are caught by timeouts instead).
settings.load_profile(os.environ.get("CGSIM_HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="module")
def vllm_encoder_target():
    """The vllm-encoder target, its environment prepared (vLLM imported and warmed); vLLM-marked tests only."""
    from cgsim.encoder.targets import encoder_target

    target = encoder_target("vllm-encoder")
    target.prepare_environment()
    return target
