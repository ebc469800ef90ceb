"""Tests of cgsim/targets/sglang/."""
