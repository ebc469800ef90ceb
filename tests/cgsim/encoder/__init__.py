"""Tests of cgsim/encoder/."""
