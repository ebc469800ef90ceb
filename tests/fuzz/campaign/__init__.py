"""Tests of fuzz/campaign/."""
