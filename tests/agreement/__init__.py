"""The agreement corpora and the scripts that record and check them; runnable as scripts
(``python tests/agreement/vllm_agreement.py check``) and importable as ``tests.agreement``."""
