"""Tests of fuzz/export_test/."""
