"""Serve a DFlash launch through vLLM's own runner with graphs and eager, and
print what a user sees (cgsim.served.consequence), or why it was not served.

    CGSIM_VLLM_SOURCE=<tree> python scripts/serve_dflash_pair.py MODE SIZES [breakable]

MODE a cudagraph_mode (FULL_AND_PIECEWISE ...), SIZES comma-separated capture
sizes; four requests, three speculative tokens.  docs/dflash-issues.md uses it.
"""

from __future__ import annotations

import json
import sys

from cgsim.config import ManagerConfig
from cgsim.modes import CUDAGraphMode
from cgsim.served import consequence
from cgsim.targets.vllm.engine import launch_for, with_dflash_draft
from cgsim.targets.vllm.runner_serve import serve_pair


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] != "breakable"):
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    mode, sizes = CUDAGraphMode.parse(argv[0]), tuple(int(s) for s in argv[1].split(","))
    launch = with_dflash_draft(launch_for(ManagerConfig(mode=mode, capture_sizes=sizes, max_num_reqs=4,
                                                        decode_query_len=4, breakable=len(argv) == 3)))
    pair = serve_pair(launch, 600)
    if pair is None or "error" in pair:
        print(f"not served: {'out of time' if pair is None else pair['error']}")
        return 2
    print(json.dumps(consequence(pair)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
