"""Tests of cgsim/report/."""
