"""Vision-encoder CUDA graphs: the second capture manager of a multimodal
engine (vLLM's ``EncoderCudaGraphManager``), run through the same flow as
the decode managers, with values of its own.

    EncoderScenario ──▶ run_encoder_scenario(handle) ──▶ EncoderTrace ──▶ check_encoder_scenario ──▶ violations
    values.py           runner.py (+ toy.py records)      trace.py           cgsim/properties/encoder.py

The spec is ``cgsim/spec/encoder.py`` (docs/encoder.md); the reference
manager (``reference.py``) is written from it, ``mutants.py`` breaks it one
bug class at a time, and ``targets.py`` builds a handle for a target name.
"""
