"""``python -m fuzz doctor``: the vLLM adapter's self-check passes on the
vLLM here (every supported release, and a source tree laid over one), and
fails with one clear line when the adapter drifts from vLLM.

Needs vLLM (the ``vllm-0.NN`` tox envs); skipped with the reason elsewhere,
unless CGSIM_REQUIRE_VLLM=1 says vLLM must be there.
"""

from __future__ import annotations

import os

import pytest

from tests.vllm_required import skip_unless_vllm

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

    monkeypatch.setattr("cgsim.recorder._replay_event", lambda step, batch, desc, *rest: Dispatch(
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

# -- the encoder manager's half ------------------------------------------------------------------------------


def _encoder_checks():
    from cgsim.targets.vllm.doctor import Check, guard_check
    from cgsim.targets.vllm.encoder_doctor import encoder_checks

    return {c.name: c for c in encoder_checks(Check, guard_check)}


def test_the_doctor_drives_the_encoder_manager_where_cgsim_speaks_its_interface():
    from cgsim.targets.vllm.encoder import missing_model_interface
    from cgsim.targets.vllm.encoder_doctor import ENCODER_CLEAN_SCENARIOS

    checks = _encoder_checks()
    assert all(c.ok and not c.findings for c in checks.values()), checks
    if missing_model_interface():
        assert list(checks) == ["encoder"] and "older model interface" in checks["encoder"].detail
    else:
        assert set(checks) == {"encoder: patches"} | {name for name, _c, _s in ENCODER_CLEAN_SCENARIOS}


def test_an_encoder_step_the_adapter_does_not_record_fails_the_doctor(monkeypatch):
    from cgsim.encoder import runner
    from cgsim.targets.vllm.encoder import missing_model_interface

    if missing_model_interface():
        pytest.skip("the encoder manager of this release is not driven (checked above)")
    monkeypatch.setattr(runner, "_captures_by_rank", lambda log: [])  # a capture that leaves no EncCapture
    checks = _encoder_checks()
    broken = [c for c in checks.values() if not c.ok]
    assert broken and all("no EncCapture event for step 0" in c.detail for c in broken)
    assert doctor_line(require_vllm(), list(checks.values())).startswith("the vLLM adapter's self-check failed")


def test_an_encoder_leak_the_tree_has_is_a_finding_of_the_doctor_not_of_the_decode_campaign(monkeypatch):
    from cgsim.encoder.toy import ToyVisionEncoder
    from cgsim.targets.vllm import doctor
    from cgsim.targets.vllm.encoder import missing_model_interface

    if missing_model_interface():
        pytest.skip("the encoder manager of this release is not driven (checked above)")

    def zero_pad(self, dst, src):  # the model's padding no longer sends padding rows to the trash frame
        dst.zero_()
        dst[: src.shape[0]].copy_(src)

    monkeypatch.setattr(ToyVisionEncoder, "_pad_row_frame", zero_pad)
    checks = _encoder_checks()
    assert all(c.ok for c in checks.values())
    found = [f for c in checks.values() for f in c.findings]
    assert found and {f.property for f in found} >= {"ENC-EQUAL"}
    assert all(f.scenario["kind"] == "encoder" and f.extra["launch"]["line"] for f in found)
    monkeypatch.setattr(doctor, "run_doctor", lambda *a, **k: list(checks.values()))
    assert self_check() == ()  # the decode campaign replays decode findings only


def test_an_encoder_campaign_stops_in_one_line_where_the_encoder_adapter_is_broken(monkeypatch, tmp_path, capsys):
    from cgsim.encoder import runner
    from cgsim.targets.vllm.encoder import missing_model_interface

    if missing_model_interface():
        pytest.skip("the encoder manager of this release is not driven (checked above)")
    monkeypatch.setattr(runner, "_captures_by_rank", lambda log: [])
    assert main(["run", "--target", "vllm-encoder", "--max-examples", "5", "--report-dir", str(tmp_path),
                 "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the vLLM encoder adapter's self-check failed" in err[0]
    assert not os.path.exists(os.path.join(tmp_path, "latest"))
