"""Tests of cgsim/cuda_mock/."""
