"""Tests of fuzz's top-level modules (the CLI, strategies, the encoder campaign)."""
