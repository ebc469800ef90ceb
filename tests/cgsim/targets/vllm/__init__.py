"""Tests of cgsim/targets/vllm/."""
