"""Dispatch maps (cgsim.report.plots): the rows follow the spec, a finding's
batch and the graph it should have landed on are marked, and ``fuzz explain
--plot`` writes PNG and SVG, or refuses in one line."""

from __future__ import annotations

import io
import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.finding import Finding, desc_from_short
from cgsim.modes import CUDAGraphMode
from cgsim.properties import ALL_PROPERTIES, check_scenario
from cgsim.report import plots
from cgsim.runner import run_scenario
from cgsim.spec import dispatch_choices, expected_capture_order, expected_dispatch
from cgsim.spec import scheduler
from cgsim.targets.mutants import MUTANT_INFO
from cgsim.trace import Dispatch, Sweep
from fuzz.cli import main

FINDINGS = Path(__file__).resolve().parents[3] / "docs" / "findings"
F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE


def need_matplotlib() -> None:
    """Pictures need the plot extra: skipped with the reason locally, a
    failure in CI (which installs it), never a silent pass."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("matplotlib is not installed in CI: .ci/run must install cgsim[plot]")
        pytest.skip("matplotlib is not installed (pip install 'cgsim[plot]')")


CONFIGS = [
    (ManagerConfig(capture_sizes=(1, 2, 4, 8, 16), max_num_reqs=8), "pr48822"),
    (ManagerConfig(capture_sizes=(1, 2, 4, 8, 16, 24), max_num_reqs=8, decode_query_len=3, lora_cases=(0, 2)), "vllm-0.32"),
    (ManagerConfig(mode="FULL", capture_sizes=(2, 8, 32), max_num_reqs=16, breakable=True), "pr48822"),
    (ManagerConfig(capture_sizes=(1, 2, 4, 8, 16, 32), max_num_reqs=16, decode_query_len=4,
                   spec_schedule=((1, 4, 3), (5, 16, 1)), num_ubatches=2, ubatch_threshold=8), "vllm-0.32"),
    (ManagerConfig(capture_sizes=(1, 4, 8), max_num_reqs=4, decode_query_len=2, varlen_decode=True), "pr48822"),
]


@pytest.mark.parametrize("config, ruleset", CONFIGS)
def test_spec_rows_are_the_spec_oracles_choice(config, ruleset):
    captured = expected_capture_order(config, ruleset)
    rows = plots.spec_rows(config, ruleset)
    assert rows
    for row in rows:
        assert scheduler.why_unschedulable(config, row.batch) is None
        assert row.chosen == expected_dispatch(row.batch, captured, config.lora_cases)
        assert set(row.expected) == set(dispatch_choices(row.batch, captured, config.lora_cases))
        assert row.agrees is True


@pytest.mark.parametrize("config, ruleset", CONFIGS)
def test_batch_grid_has_every_decode_and_every_prefill_cell(config, ruleset):
    t_max = plots.token_limit(config)
    grid = plots.batch_grid(config)
    for lora in config.lora_cases:
        mine = [b for b in grid if b.num_active_loras == lora]
        decode = {b.query_lens for b in mine if not b.has_prefill and b.uniform_token_count is not None}
        want = {(scheduler.decode_query_len(config, r),) * r for r in range(1, config.max_num_reqs + 1)
                if r * scheduler.decode_query_len(config, r) <= t_max}
        assert decode == want
        prefill = {(b.num_reqs, b.num_tokens) for b in mine if b.has_prefill}
        assert prefill == {(r, t) for r in range(1, config.max_num_reqs + 1) for t in range(r, t_max + 1)}
        if config.varlen_decode:
            assert any(not b.has_prefill and b.uniform_token_count is None for b in mine)
    assert t_max > config.max_capture_size  # the eager edge past the largest graph shows


def test_big_configs_are_sampled():
    config = ManagerConfig(capture_sizes=tuple([1, 2, 4] + list(range(8, 1025, 8))), max_num_reqs=512)
    grid = plots.batch_grid(config)
    prefill = [b for b in grid if b.has_prefill]
    assert len({b.num_tokens for b in prefill}) <= plots.MAX_TOKEN_CELLS
    assert len({b.num_reqs for b in prefill}) <= plots.MAX_REQ_CELLS
    assert max(b.num_tokens for b in prefill) > 1024


@pytest.mark.parametrize("desc", [
    BatchDescriptor(F, 8, 8, 1),
    BatchDescriptor(F, 12, 4, 3, 3, 2, 2),
    BatchDescriptor(P, 16),
    BatchDescriptor(N, 5, 3),
    BatchDescriptor(F, 64, 32, None, 4, 1),
])
def test_desc_from_short_inverts_short(desc):
    assert desc_from_short(desc.short()) == desc
    assert desc_from_short("Desc(FULL reqs=2)") is None
    assert desc_from_short("Batch(reqs=1)") is None


DISPATCH_MUTANTS = sorted(n for n, m in MUTANT_INFO.items() if ALL_PROPERTIES[m.caught_by].family == "dispatch")


@pytest.mark.parametrize("read", ["facts", "message"])
@pytest.mark.parametrize("name", DISPATCH_MUTANTS)
def test_a_dispatch_findings_mark_names_what_the_target_returned(name, read):
    """The mark is the batch the violation names and the descriptor the run
    dispatched it to (a dispatch step's, or the dispatch sweep's after the
    capture): read from the finding's facts (or, for a finding recorded
    before them, from the property's message), checked against the Trace."""
    from dataclasses import replace

    info = MUTANT_INFO[name]
    scenario = info.example()
    trace = run_scenario(scenario, target=f"mutant:{name}", backend="mock")
    violations = [v for v in check_scenario(scenario, trace).violations if v.property == info.caught_by]
    assert violations
    dispatched = {e.step: (e.batch, e.desc) for e in trace.events if isinstance(e, Dispatch)}
    swept = {e.step: dict(zip(e.batches, e.descs)) for e in trace.events if isinstance(e, Sweep)}
    kinds = set()
    for v in violations:
        finding = Finding.from_violation(v, scenario.to_json(), f"mutant:{name}", "mock", scenario.short())
        assert {"batch", "got"} <= set(finding.facts), v.message
        # The fields with no message to read, or a finding recorded before them (cgsim.finding upgrades it).
        finding = replace(finding, facts={}) if read == "message" else replace(finding, message="(not read)")
        mark = plots.finding_mark(finding)
        if "dispatch sweep" in v.message:
            assert mark is not None, v.message
            assert mark.batch in swept[v.step] and mark.chosen == swept[v.step][mark.batch], v.message
            kinds.add("sweep")
        elif v.step in dispatched:
            assert mark is not None
            assert (mark.batch, mark.chosen) == dispatched[v.step], v.message
            kinds.add("step")
        else:
            assert mark is None  # e.g. CAPTURE-USEFUL on the capture step
            continue
        assert plots.is_dispatch_picture_finding(finding)
        cfg = scenario.config
        assert set(mark.expected) == set(dispatch_choices(mark.batch, expected_capture_order(cfg, scenario.ruleset), cfg.lora_cases))
        assert mark.chosen not in mark.expected or not mark.expected
        rows = plots.finding_rows(finding)
        mine = [r for r in rows if r.batch == mark.batch]
        assert len(mine) == 1 and mine[0].chosen == mark.chosen
        assert mine[0].agrees is False
    if info.caught_by != "CAPTURE-USEFUL":
        assert kinds  # every dispatch mutant's example has a marked batch (a step's, the sweep's or both)


def test_sweep_rows_judge_a_sweeps_decisions():
    config = ManagerConfig(capture_sizes=(1, 2, 4), max_num_reqs=4)
    captured = expected_capture_order(config, "pr48822")
    plan = scheduler.sweep_plan(config, captured)
    right = [expected_dispatch(b, captured, config.lora_cases) for b in plan.shapes]
    rows = plots.sweep_rows(plan.shapes, right, captured, config.lora_cases)
    assert all(r.agrees for r in rows)
    wrong = [plots.eager_descriptor(b, (0,)) if d.cg_mode == F else d for b, d in zip(plan.shapes, right)]
    rows = plots.sweep_rows(plan.shapes, wrong, captured, config.lora_cases)
    assert {r.batch for r in rows if r.agrees is False} == {b for b, d in zip(plan.shapes, right) if d.cg_mode == F}
    need_matplotlib()
    svg = plots.render_dispatch_map(rows, fmt="svg", lora_cases=config.lora_cases).decode()
    assert "graph disagrees with the spec" in svg and "decode, query length 1" in svg


def _finding(name: str) -> dict:
    return json.loads((FINDINGS / name).read_text())


def test_non_dispatch_findings_get_no_picture():
    for name in ("init-total-6bd79114c6.json", "capture-useful-c3e5a31f32.json", "mode-resolution-1d6434a595.json"):
        data = _finding(name)
        assert not plots.is_dispatch_picture_finding(data)
        assert plots.finding_picture(data) is None


def _pixels(png: bytes):
    import matplotlib.image as mpimg

    return mpimg.imread(io.BytesIO(png), format="png")


def _has_color(img, rgb, tol=0.03) -> bool:
    import numpy as np

    return bool((np.abs(img[..., :3] - np.array(rgb)).max(axis=-1) < tol).any())


def test_finding_picture_marks_the_batch_and_the_expected_graph():
    need_matplotlib()
    data = _finding("dispatch-complete-ed6a3d919d.json")
    png = plots.finding_picture(data, "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    img = _pixels(png)
    assert _has_color(img, (0xd6 / 255, 0x27 / 255, 0x28 / 255))  # the red box and outline
    assert _has_color(img, plots._NONE_RGB)  # the eager cell it went to
    svg = plots.finding_picture(data, "svg").decode()
    ET.fromstring(svg)
    for words in ("DISPATCH-COMPLETE at step 1", "Desc(NONE tokens=5 reqs=3)", "Desc(PIECEWISE tokens=7)",
                  "the finding", "batches on the graph that should serve it", "padding waste", "prefill / mixed",
                  "decode, query length 3", "P7", "FULL graph", "PIECEWISE graph"):
        assert words.replace("'", "&#x27;") in svg or words in svg, words


def test_rows_that_disagree_with_the_spec_are_dotted():
    need_matplotlib()
    config, ruleset = CONFIGS[0]
    rows = plots.spec_rows(config, ruleset)
    wrong = next(r for r in rows if r.chosen.cg_mode == F)
    rows = [r if r is not wrong else plots.DispatchRow(r.batch, plots.eager_descriptor(r.batch, (0,)), r.expected) for r in rows]
    svg = plots.render_dispatch_map(rows, fmt="svg", title="t", capture_sizes=config.capture_sizes).decode()
    assert "graph disagrees with the spec" in svg
    clean = plots.render_dispatch_map(plots.spec_rows(config, ruleset), fmt="svg", title="t").decode()
    assert "disagrees" not in clean


def test_unknown_choices_are_drawn_as_unknown():
    need_matplotlib()
    b = Batch((1, 1))
    svg = plots.render_dispatch_map([plots.DispatchRow(b, None, ())], fmt="svg").decode()
    assert "graph not known" in svg


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_explain_plot_writes_the_map(tmp_path, capsys, suffix):
    need_matplotlib()
    out = tmp_path / f"map.{suffix}"
    assert main(["explain", "--capture-sizes", "1,2,4,8", "--max-num-reqs", "4", "--lora-cases", "0,1",
                 "--plot", str(out)]) == 0
    assert f"dispatch map written to {out}" in capsys.readouterr().out
    data = out.read_bytes()
    if suffix == "png":
        assert data[:4] == b"\x89PNG"
        img = _pixels(data)
        assert img.shape[0] > 400 and img.shape[1] > 600
    else:
        text = data.decode()
        ET.fromstring(text)
        # max_num_reqs 4 drops the 8-request decode graph: F4 serves 3 and 4 requests.
        assert "LoRA case 1" in text and "decode, query length 1" in text and ">F4<" in text and ">P8<" in text
        assert ">F8<" not in text


def test_explain_plot_without_matplotlib_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = tmp_path / "p.svg"
    assert main(["explain", "--plot", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before printing the tables
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "matplotlib" in lines[0] and "cgsim[plot]" in lines[0], lines
    assert not out.exists()
    with pytest.raises(plots.MissingMatplotlib):
        plots.explain_picture(*CONFIGS[0])


def test_explain_plot_bad_suffix(capsys):
    assert main(["explain", "--plot", "map.bmp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ".png or .svg" in err[0]
