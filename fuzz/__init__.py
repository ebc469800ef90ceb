"""Hypothesis strategies, the lifecycle state machine and the campaign CLI of cgsim."""
