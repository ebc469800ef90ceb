"""Properties of graph memory: GRAPH-POOL-SHARED and GRAPH-MEMORY-FIT.

Engines size the KV cache from what is left after the graphs: every byte a
graph holds that its work does not need is KV cache lost.  Both properties
read the ``GraphBytes`` the runner records after a capture, where the backend
accounts graph memory (the CPU mock: its blocks, rounded to 512 bytes, so
bytes compare one capture with another, never with a GPU's numbers).
"""

from __future__ import annotations

from cgsim.properties.registry import Violation, declare
from cgsim.properties.view import RunView, group
from cgsim.trace import GraphBytes, Trace

__all__ = ["manager_graph_bytes", "graph_memory_by_manager"]


def manager_graph_bytes(graphs: list[GraphBytes]) -> int:
    """What the pools holding ``graphs`` reserve in all: the manager's graph memory."""
    return sum({e.pool: e.pool_bytes for e in graphs}.values())


def graph_memory_by_manager(trace: Trace) -> tuple[tuple[str, int], ...]:
    """(manager, bytes its graph pools reserve) after each capture that
    recorded graph memory: the main manager ("main") and each sub-manager."""
    out: list[tuple[str, int]] = []
    for name, t in (("main", trace), *sorted(trace.managers.items())):
        by_step: dict[int, list[GraphBytes]] = {}
        for e in t.of(GraphBytes):
            by_step.setdefault(e.step, []).append(e)
        out += [(name, manager_graph_bytes(graphs)) for _, graphs in sorted(by_step.items())]
    return tuple(out)


def _has_graph_bytes(run: RunView) -> bool:
    return any(len(g) > 1 for g in run.graph_bytes.values())


@declare("GRAPH-POOL-SHARED", "the FULL graphs one capture stores share one memory pool, so graph memory grows as the "
         "largest capture, not the sum of them", family="memory", applies=_has_graph_bytes)
def graph_pool_shared(run: RunView) -> list[Violation]:
    # vLLM captures every graph into the platform's global pool, SGLang into
    # its global graph memory pool: a smaller graph reuses the blocks a larger
    # one freed, which only one pool allows.
    out: list[Violation] = []
    for step, graphs in sorted(run.graph_bytes.items()):
        pools: dict[int, list[GraphBytes]] = {}
        for e in graphs:
            pools.setdefault(e.pool, []).append(e)
        if len(pools) < 2:
            continue
        held = manager_graph_bytes(graphs)
        largest = max(members[0].pool_bytes for members in pools.values())
        out.append(Violation(
            "GRAPH-POOL-SHARED",
            f"the {len(graphs)} FULL graphs of this capture went into {len(pools)} memory pools, which reserve "
            f"{held} bytes in all (the largest pool {largest}): no capture reuses the blocks another one freed",
            step,
            (("graphs", [e.desc.to_json() for e in graphs]),
             ("pools", [{"pool": p, "graphs": [e.desc.to_json() for e in members],
                         "reserved_bytes": members[0].pool_bytes} for p, members in sorted(pools.items())]),
             ("graph_memory_bytes", held), ("largest_pool_bytes", largest)),
        ))
    return out


def _has_measured_forwards(run: RunView) -> bool:
    return any(e.forward_bytes is not None for graphs in run.graph_bytes.values() for e in graphs)


@declare("GRAPH-MEMORY-FIT", "a FULL graph's capture takes no pool memory beyond what the model's forwards at the "
         "graph's own size take", family="memory", applies=_has_measured_forwards)
def graph_memory_fit(run: RunView) -> list[Violation]:
    # A graph replays only batches up to its own size (the fit rule), so
    # buffers its capture allocates beyond its forwards (a static output or
    # scratch sized for the largest graph) are memory no replay uses.
    out: list[Violation] = []
    for step, graphs in sorted(run.graph_bytes.items()):
        for e in graphs:
            if e.forward_bytes is None or e.graph_bytes <= e.forward_bytes:
                continue
            extra = e.graph_bytes - e.forward_bytes
            out.append(Violation(
                "GRAPH-MEMORY-FIT",
                f"the capture of {e.desc.short()} was handed {e.graph_bytes} bytes of its pool, {extra} of them beyond "
                f"the {e.forward_bytes} the model's forwards at its own size ({e.desc.num_tokens} tokens) took",
                step,
                (("graph", e.desc.to_json()), ("graph_bytes", e.graph_bytes), ("forward_bytes", e.forward_bytes),
                 ("extra_bytes", extra)),
            ))
    return group(out)
