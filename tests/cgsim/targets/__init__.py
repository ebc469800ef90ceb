"""Tests of cgsim/targets/."""
