"""Tests of cgsim/spec/."""
