"""Tests of cgsim/properties/."""
