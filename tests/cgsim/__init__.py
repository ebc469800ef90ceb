"""Tests of cgsim's top-level modules."""
