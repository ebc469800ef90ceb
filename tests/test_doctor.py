"""``python -m fuzz doctor``: the vLLM adapter's self-check passes on the
vLLM here (every supported release, and a source tree laid over one), and
fails with one clear line when the adapter drifts from vLLM.

Needs vLLM (the ``vllm-0.NN`` tox envs); skipped with the reason elsewhere,
unless CGSIM_REQUIRE_VLLM=1 says vLLM must be there.
"""

from __future__ import annotations

import pytest

from vllm_required import skip_unless_vllm

skip_unless_vllm()

import cgsim.targets.vllm.handle as adapter  # noqa: E402
from cgsim.targets.vllm.compat import require_vllm  # noqa: E402
from cgsim.targets.vllm.doctor import DoctorFailed, doctor_line, run_doctor, self_check  # noqa: E402
from fuzz.cli import main  # noqa: E402

pytestmark = pytest.mark.vllm


def test_the_doctor_passes_on_this_vllm(capsys):
    checks = run_doctor()
    failed = [c for c in checks if not c.ok]
    assert not failed, failed
    names = {c.name for c in checks}
    assert {"full-and-piecewise", "compiled-piecewise", "full", "speculative-decoding"} <= names
    assert "release-recapture-e178b48079" in names  # the documented findings were replayed
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"vLLM {require_vllm().version}" in out and "0 failed" in out


def test_a_broken_mechanism_fails_the_doctor_in_one_line(monkeypatch, capsys):
    # Drift of the adapter's mechanics: it runs a dispatch step without the
    # replay the runner must record (as if vLLM renamed what it calls).
    from cgsim.trace import Dispatch

    monkeypatch.setattr("cgsim.runner._replay_event", lambda step, batch, desc, *rest: Dispatch(
        step=step, batch=batch, desc=desc, captured_flag=True))
    checks = run_doctor()
    line = doctor_line(require_vllm(), checks)
    assert line is not None and "\n" not in line
    assert "self-check failed" in line and "no Replay event" in line
    with pytest.raises(DoctorFailed):
        self_check()
    assert main(["doctor"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the vLLM adapter's self-check failed")


def test_a_tree_that_violates_a_property_gets_findings_not_a_failed_doctor(monkeypatch, capsys):
    # What a dispatch bug in the tree looks like to the adapter: decode batches
    # run eagerly although a graph fits them.  The mechanics work, so the
    # doctor exits 1 with findings, and the self-check hands them to the campaign.
    original = adapter.VllmManagerHandle._dispatch

    def eager_decodes(self, batch):
        desc = original(self, batch)
        return desc if desc.uniform_token_count is None else adapter.BatchDescriptor(
            adapter.N, batch.num_tokens, batch.num_reqs, num_active_loras=desc.num_active_loras,
            num_ubatches=batch.num_ubatches)

    monkeypatch.setattr(adapter.VllmManagerHandle, "_dispatch", eager_decodes)
    checks = run_doctor()
    assert doctor_line(require_vllm(), checks) is None
    found = [f for c in checks for f in c.findings]
    assert found and any(f.property.startswith("DISPATCH") for f in found), [c.detail for c in checks]
    assert {f.property for f in self_check()} == {f.property for f in found}
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "FIND" in out and "finding(s) about the tree" in out