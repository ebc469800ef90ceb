"""cgsim: simulate and fuzz the CUDA-graph capture logic of LLM inference engines.

See README.md for the quick start and SPEC/ARCHITECTURE notes in the docs.
"""

__version__ = "0.1.0"
