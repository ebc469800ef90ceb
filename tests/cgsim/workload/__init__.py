"""Tests of cgsim/workload/."""
