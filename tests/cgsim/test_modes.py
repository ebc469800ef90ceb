"""SPEC §2 mode resolution: one test per rule of the table, plus properties."""

import pytest
from hypothesis import given, strategies as st

from cgsim.modes import AttentionSupport as S, CUDAGraphMode as M, ModeResolutionError, required_support, resolve_mode


def test_mode_parts():
    assert M.FULL_DECODE_ONLY.decode_mode() == M.FULL and M.FULL_DECODE_ONLY.mixed_mode() == M.NONE
    assert M.FULL_AND_PIECEWISE.mixed_mode() == M.PIECEWISE and M.FULL_AND_PIECEWISE.separate_routine()
    assert not M.FULL.separate_routine() and M.FULL.decode_mode() == M.FULL == M.FULL.mixed_mode()
    assert M.FULL_AND_PIECEWISE.has_full() and M.FULL_AND_PIECEWISE.has_piecewise()
    assert not M.FULL_DECODE_ONLY.has_piecewise() and not M.PIECEWISE.has_full()
    assert M.from_parts(M.FULL, M.PIECEWISE) == M.FULL_AND_PIECEWISE


def test_rule_none_stays_none():
    for s in S:
        assert resolve_mode(M.NONE, s, 3, False, False) == M.NONE


def test_rule_mixed_full_never_raises():
    with pytest.raises(ModeResolutionError, match="NEVER"):
        resolve_mode(M.FULL, S.NEVER)


@pytest.mark.parametrize("split,expected", [(True, M.FULL_AND_PIECEWISE), (False, M.FULL_DECODE_ONLY)])
def test_rule_mixed_full_below_always_downgrades(split, expected):
    assert resolve_mode(M.FULL, S.UNIFORM_BATCH, 1, attention_split=split) == expected


@pytest.mark.parametrize("split,expected", [(True, M.PIECEWISE), (False, M.NONE)])
def test_rule_decode_full_with_never(split, expected):
    assert resolve_mode(M.FULL_DECODE_ONLY, S.NEVER, 1, attention_split=split) == expected


@pytest.mark.parametrize("split,expected", [(True, M.PIECEWISE), (False, M.NONE)])
def test_rule_multi_token_decode_needs_uniform_batch(split, expected):
    assert resolve_mode(M.FULL_AND_PIECEWISE, S.UNIFORM_SINGLE_TOKEN_DECODE, 3, attention_split=split) == expected
    # q == 1 keeps the FULL decode part
    assert resolve_mode(M.FULL_AND_PIECEWISE, S.UNIFORM_SINGLE_TOKEN_DECODE, 1) == M.FULL_AND_PIECEWISE


def test_rule_no_piecewise_capture_drops_piecewise_part():
    assert resolve_mode(M.PIECEWISE, S.ALWAYS, piecewise_available=False) == M.NONE
    assert resolve_mode(M.FULL_AND_PIECEWISE, S.ALWAYS, piecewise_available=False) == M.FULL_DECODE_ONLY


def test_seed_inkling_uniform_batch_keeps_piecewise():
    # vLLM PR 48822: the Inkling backend moved to UNIFORM_BATCH; PIECEWISE stays PIECEWISE.
    assert resolve_mode(M.PIECEWISE, S.UNIFORM_BATCH, 2) == M.PIECEWISE


def test_seed_single_token_backend_downgrades_full_decode_for_spec_decode():
    assert resolve_mode(M.FULL_AND_PIECEWISE, S.UNIFORM_SINGLE_TOKEN_DECODE, 2) == M.PIECEWISE
    assert resolve_mode(M.FULL_DECODE_ONLY, S.UNIFORM_SINGLE_TOKEN_DECODE, 2, attention_split=False) == M.NONE


def test_parse_errors_name_choices():
    with pytest.raises(ValueError, match="FULL_AND_PIECEWISE"):
        M.parse("FULLISH")
    with pytest.raises(ValueError, match="UNIFORM_BATCH"):
        S.parse("sometimes")


args = st.tuples(st.sampled_from(list(M)), st.integers(1, 5), st.booleans(), st.booleans())


def _resolve(mode, support, q, split, avail):
    try:
        return resolve_mode(mode, support, q, split, avail)
    except ModeResolutionError:
        return None


@given(args, st.sampled_from(list(S)))
def test_resolution_idempotent(a, support):
    mode, q, split, avail = a
    once = _resolve(mode, support, q, split, avail)
    if once is not None:
        assert resolve_mode(once, support, q, split, avail) == once


@given(args, st.sampled_from(list(S)))
def test_resolution_never_needs_more_support_than_declared(a, support):
    mode, q, split, avail = a
    out = _resolve(mode, support, q, split, avail)
    if out is not None:
        assert required_support(out, q) <= support
        if not avail:
            assert not out.has_piecewise()


@given(args, st.sampled_from(list(S)), st.sampled_from(list(S)))
def test_resolution_monotone_in_support(a, s1, s2):
    """More support never loses a FULL decode graph nor turns success into an error."""
    lo, hi = sorted((s1, s2))
    mode, q, split, avail = a
    low, high = _resolve(mode, lo, q, split, avail), _resolve(mode, hi, q, split, avail)
    if low is not None:
        assert high is not None
        rank = {M.NONE: 0, M.PIECEWISE: 1, M.FULL: 2}
        assert rank[high.decode_mode()] >= rank[low.decode_mode()]
        assert high.has_full() or not low.has_full()
