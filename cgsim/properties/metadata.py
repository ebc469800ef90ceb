"""Properties of what captured graphs read at replay: METADATA-LIVE,
PAD-CONSISTENT, KEY-CONSISTENT."""

from __future__ import annotations

from cgsim.descriptors import BatchDescriptor
from cgsim.modes import CUDAGraphMode
from cgsim.properties.registry import Violation, declare
from cgsim.properties.view import RunView, group, sweep_violations
from cgsim.trace import CreateForwardFn, Dispatch, Forward, PiecewiseCapture, PiecewiseLookup, Replay

__all__ = ["covers_query_len"]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE


def _metadata_judged(run: RunView, r: Replay) -> bool:
    """FULL replays, and breakable PIECEWISE replays under rulesets that pad."""
    if r.path == "full":
        return True
    return r.path == "piecewise" and run.trace.uses_breakable and run.ruleset.pad_breakable_piecewise_metadata


def _has_metadata_replay(run: RunView) -> bool:
    return any(_metadata_judged(run, r) or r.metadata_alive is not None for r in run.of(Replay))


def _has_padded_replay(run: RunView) -> bool:
    return any(_metadata_judged(run, r) for r in run.of(Replay)) or any(
        d.cg_mode == F for sv in run.captured_sweeps for d in sv.sweep.descs)


@declare("METADATA-LIVE", "metadata read by a stored graph is alive and not rebound until the graph is released",
         family="metadata", applies=_has_metadata_replay)
def metadata_live(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    for r in run.of(Replay):
        head = f"{r.path} replay of {r.desc.short()} for {r.batch.short()}"
        if r.metadata_alive is False:
            out.append(Violation(
                "METADATA-LIVE", f"{head}: the metadata #{r.graph_metadata} the graph was captured with is no longer alive", r.step))
        if not _metadata_judged(run, r):
            continue
        if r.graph_metadata is not None and r.runtime_metadata is None and r.path == "full":
            out.append(Violation(
                "METADATA-LIVE",
                f"{head}: no runtime metadata was prepared, so the graph reads whatever the buffers of #{r.graph_metadata} hold",
                r.step,
            ))
            continue
        g, rt = run.metadata(r.graph_metadata), run.metadata(r.runtime_metadata)
        if g is None or rt is None:
            continue
        if set(g.buffers) != set(rt.buffers):
            out.append(Violation(
                "METADATA-LIVE",
                f"{head}: runtime metadata #{rt.id} was rebound to new buffers {sorted(set(rt.buffers) - set(g.buffers))} "
                f"instead of updating the captured buffers {sorted(g.buffers)} of #{g.id} in place (the graph reads stale values)",
                r.step,
            ))
    return group(out)


def covers_query_len(captured_max_query_len: int, batch_max_query_len: int) -> bool:
    """Whether attention metadata captured for ``captured_max_query_len``
    covers a batch whose longest request is ``batch_max_query_len`` (a graph's
    kernels are specialised for it; export-test carries this rule as written)."""
    return captured_max_query_len >= batch_max_query_len


@declare("PAD-CONSISTENT", "the metadata a graph was captured with covers every batch dispatched to it",
         family="metadata", applies=_has_padded_replay, rule=covers_query_len)
def pad_consistent(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    for r in run.of(Replay):
        if not _metadata_judged(run, r):
            continue
        g, rt = run.metadata(r.graph_metadata), run.metadata(r.runtime_metadata)
        head = f"{r.path} replay of {r.desc.short()} for {r.batch.short()}"
        what = {"batch": r.batch.shape.to_json(), "got": r.desc.to_json()}
        if g is not None and rt is not None:
            if (g.num_reqs, g.num_tokens) != (rt.num_reqs, rt.num_tokens):
                out.append(Violation(
                    "PAD-CONSISTENT",
                    f"{head}: captured with metadata sized num_reqs={g.num_reqs} num_tokens={g.num_tokens}, runtime "
                    f"metadata has num_reqs={rt.num_reqs} num_tokens={rt.num_tokens} (expected the padded sizes)",
                    r.step, (("mismatch", "size"),), **what,
                ))
        if g is not None and not covers_query_len(g.max_query_len, r.batch.max_query_len):
            out.append(Violation(
                "PAD-CONSISTENT",
                f"{head}: graph captured with max_query_len={g.max_query_len} < the batch's max_query_len {r.batch.max_query_len}",
                r.step, (("mismatch", "max_query_len"),), **what,
            ))
    # Every swept batch that lands on a FULL graph, against the metadata that
    # graph was captured with: a replay would read exactly that.
    for sv in run.captured_sweeps:
        failures = []
        # What the captured metadata is short of, per failing batch: "max_query_len" or "size".
        mismatch: dict = {}
        for b, d in sv.landing(F):
            if d not in sv.captured.stored:
                continue
            g = run.captured_with(d, sv.step)
            if g is None:
                continue
            if not covers_query_len(g.max_query_len, b.max_query_len):
                head = f"{b.short()} dispatched to FULL {d.short()}"
                mismatch[b] = "max_query_len"
                failures.append((b, f"{head}, whose graph was captured with metadata for max_query_len={g.max_query_len} "
                                    f"< the batch's max_query_len {b.max_query_len}"))
            elif g.num_tokens != d.num_tokens or (d.num_reqs is not None and g.num_reqs != d.num_reqs):
                head = f"{b.short()} dispatched to FULL {d.short()}"
                mismatch[b] = "size"
                failures.append((b, f"{head}, whose graph was captured with metadata sized num_reqs={g.num_reqs} "
                                    f"num_tokens={g.num_tokens} (the descriptor pads to num_reqs={d.num_reqs} "
                                    f"num_tokens={d.num_tokens})"))
        out += sweep_violations("PAD-CONSISTENT", sv, failures, lambda b, mismatch=mismatch: (("mismatch", mismatch[b]),))
    return group(out)


def _applies_key_consistent(run: RunView) -> bool:
    dispatch_steps = {d.step for d in run.of(Dispatch)}
    return any(lk.step in dispatch_steps for lk in run.of(PiecewiseLookup)) or any(
        r.path == "piecewise" for r in run.of(Replay)
    ) or any(d.desc.cg_mode == P for d in run.of(Dispatch))


@declare("KEY-CONSISTENT", "a piecewise graph is looked up under the key it was captured under",
         family="metadata", applies=_applies_key_consistent)
def key_consistent(run: RunView) -> list[Violation]:
    out: list[Violation] = []
    # Capture keys per descriptor, per capture session (latest wins).
    keys_at: list[tuple[int, dict[BatchDescriptor, set[tuple]]]] = []
    for s in run.sessions:
        keys: dict[BatchDescriptor, set[tuple]] = {}
        current: BatchDescriptor | None = None
        for e in s.events:
            if isinstance(e, (CreateForwardFn, Forward)) and e.desc is not None:
                current = e.desc
                if isinstance(e, Forward) and e.mode == P and e.key is not None:
                    keys.setdefault(e.desc, set()).add(tuple(e.key))
            elif isinstance(e, PiecewiseCapture) and current is not None:
                keys.setdefault(current, set()).add(tuple(e.key))
        keys_at.append((s.step if s.step is not None else -1, keys))

    def captured_keys(desc: BatchDescriptor, step: int) -> set[tuple] | None:
        for s_step, keys in reversed(keys_at):
            if s_step <= step and desc in keys:
                return keys[desc]
        return None

    for v in run.dispatches:
        d, b, step = v.dispatch.desc, v.dispatch.batch, v.dispatch.step
        piecewise_path = v.replay is not None and v.replay.path == "piecewise"
        if d.cg_mode != P and not piecewise_path:
            continue
        if v.captured is None:
            continue  # nothing captured (yet, or any more): BEFORE-CAPTURE's business
        known = captured_keys(d, step)
        runtime_keys = [tuple(lk.key) for lk in v.lookups] + [
            tuple(f.key) for f in v.runtime_forwards if f.key is not None and f.mode == P]
        if known:
            wrong = [k for k in dict.fromkeys(runtime_keys) if k not in known]
            if wrong:
                out.append(Violation(
                    "KEY-CONSISTENT",
                    f"{b.short()} dispatched to {d.short()} is looked up under key {wrong[0]}, but that piecewise graph "
                    f"was captured under {sorted(known, key=repr)}",
                    step,
                ))
                continue
        misses = [lk for lk in v.lookups if not lk.hit]
        if misses and (known is not None or piecewise_path or d in v.captured.piecewise):
            out.append(Violation(
                "KEY-CONSISTENT",
                f"{b.short()} dispatched to {d.short()}: piecewise lookup for key {tuple(misses[0].key)} missed"
                + (f" (captured keys: {sorted(known, key=repr)})" if known else " (no piecewise graph under that key)"),
                step,
            ))
    return group(out)
