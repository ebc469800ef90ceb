"""Dispatch maps: where every batch a scheduler can produce lands, as a picture.

One heat map per batch kind (each decode query length, varlen decode,
prefill/mixed) and LoRA case: x is the batch's tokens, y its requests, each
cell coloured by the graph the batch lands on (hue: FULL / PIECEWISE / NONE;
shade: graph size, darker is larger; white lines where the graph changes; a
label such as ``F8`` or ``P16·r8`` on each region), and below it the padding
waste of that graph (padded tokens / graph tokens).  A finding's batch is
boxed in red, the region of the graph the spec says should have served it
outlined in dashed red, and every other batch whose graph disagrees with the
spec carries a red dot.

The input is plain data, a list of ``DispatchRow(batch, chosen, expected)``:
from the spec alone (``spec_rows``: what ``fuzz explain`` draws), from a
finding (``finding_rows``: the spec's map with the finding's batch put where
the target sent it) or from any run that recorded its dispatch decisions.

matplotlib is optional (``pip install 'cgsim[plot]'``) and imported only when
a picture is drawn; without it ``MissingMatplotlib`` says how to get it.
There is no hand-drawn fallback: a picture without legend, colour scale and
readable ticks is worse than the text tables ``fuzz explain`` prints anyway.
"""

from __future__ import annotations

import bisect
import io
import math
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor, BatchShape, lora_case
from cgsim.finding import facts_of_old_finding
from cgsim.modes import CUDAGraphMode
from cgsim.spec import desc_sort_key, dispatch_choices, eager_descriptor, expected_capture_order, resolved_mode
from cgsim.spec import scheduler
from cgsim.spec.fit import padding_waste

__all__ = [
    "DispatchRow",
    "Mark",
    "MissingMatplotlib",
    "PICTURE_FORMATS",
    "picture_format",
    "require_matplotlib",
    "spec_rows",
    "finding_rows",
    "finding_mark",
    "sweep_rows",
    "is_dispatch_picture_finding",
    "render_dispatch_map",
    "save_dispatch_map",
    "explain_picture",
    "finding_picture",
]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
PICTURE_FORMATS = ("png", "svg")

# A panel is at most this many cells wide and high; larger configs are
# sampled on a regular step (a cell then stands for the batch at its lower
# corner).  Keeps a 1024-token, 256-request config to a few seconds of
# dispatch-oracle calls and a picture whose cells are still visible.
MAX_TOKEN_CELLS = 192
MAX_REQ_CELLS = 96


class MissingMatplotlib(ImportError):
    """A picture was asked for but matplotlib is not installed."""

    def __init__(self) -> None:
        super().__init__("drawing a dispatch map needs matplotlib, which is not installed: "
                         "pip install 'cgsim[plot]' (or pip install matplotlib)")


@dataclass(frozen=True)
class DispatchRow:
    """One batch and where it went.

    ``chosen``: the descriptor dispatch returned (NONE: eager; None: not
    known).  ``expected``: every descriptor the spec accepts for the batch
    (``cgsim.spec.dispatch_choices``); empty means the spec expects an eager
    run, so a NONE ``chosen`` agrees with it.
    """

    batch: Batch | BatchShape
    chosen: BatchDescriptor | None
    expected: tuple[BatchDescriptor, ...] = ()

    @property
    def agrees(self) -> bool | None:
        """Whether ``chosen`` is one the spec accepts (None: chosen unknown)."""
        if self.chosen is None:
            return None
        if not self.expected:
            return self.chosen.cg_mode == N
        return self.chosen in self.expected


@dataclass(frozen=True)
class Mark:
    """The batch a finding is about: boxed, with its expected graph outlined."""

    batch: Batch | BatchShape
    chosen: BatchDescriptor | None
    expected: tuple[BatchDescriptor, ...]
    caption: str = ""


def require_matplotlib() -> Any:
    """The ``matplotlib`` module, or MissingMatplotlib.  Pictures are drawn on
    bare ``Figure`` objects, never through pyplot: no global backend or figure
    state is touched (a notebook's or a test suite's own plots are unaffected,
    and reports can be drawn from any thread)."""
    try:
        import matplotlib
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError:
        raise MissingMatplotlib() from None
    return matplotlib


# -- the data: which batches, where the spec sends them ---------------------------------------
def _step(limit: int, cells: int) -> int:
    return max(1, math.ceil(limit / cells))


def _even_lens(tokens: int, reqs: int) -> tuple[int, ...]:
    base, extra = divmod(tokens, reqs)
    return (base + 1,) * extra + (base,) * (reqs - extra)


def token_limit(config: ManagerConfig, max_tokens: int | None = None) -> int:
    """The x extent: a little past the largest graph, so the eager cliff shows."""
    largest = config.max_capture_size or max(config.capture_sizes)
    # At least as far as the dispatch sweep goes, so every swept batch has its cell.
    limit = max(largest + max(2, largest // 4), scheduler.sweep_token_limit(config))
    return min(limit, max_tokens) if max_tokens else limit


def batch_grid(config: ManagerConfig, max_tokens: int | None = None) -> list[Batch]:
    """The batches a scheduler can produce for ``config`` (``cgsim.spec.scheduler``),
    one per (kind, LoRA case, requests, tokens): every uniform decode (each
    request count at the schedule's length for it), every varlen decode shape
    when varlen decode is on, and a prefill/mixed batch for every request and
    token count (dispatch sees neither its lengths nor its max_query_len, so
    one per cell stands for all).  Sampled on a regular step past
    MAX_TOKEN_CELLS x MAX_REQ_CELLS."""
    t_max = token_limit(config, max_tokens)
    r_max = config.max_num_reqs
    ts, rs = _step(t_max, MAX_TOKEN_CELLS), _step(r_max, MAX_REQ_CELLS)
    reqs = range(1, r_max + 1, rs)
    out: list[Batch] = []
    for lora in sorted(config.lora_cases):
        for r in range(1, r_max + 1):
            q = scheduler.decode_query_len(config, r)
            if r * q <= t_max and (r - 1) % rs == 0:
                out.append(scheduler.make_batch(config, (q,) * r, lora))
        if config.varlen_decode:
            for r in reqs:
                for t in range(1, t_max + 1, ts):
                    if r <= t <= r * config.decode_query_len:
                        lens = _even_lens(t, r)
                        if len(set(lens)) > 1:
                            out.append(scheduler.make_batch(config, lens, lora))
        for r in reqs:
            for t in range(1, t_max + 1, ts):
                if t >= r:
                    out.append(scheduler.make_batch(config, _even_lens(t, r), lora, has_prefill=True))
    return out


def _captured(config: ManagerConfig, ruleset: str) -> tuple[BatchDescriptor, ...]:
    return tuple(expected_capture_order(config, ruleset))


def spec_rows(config: ManagerConfig, ruleset: str, max_tokens: int | None = None) -> list[DispatchRow]:
    """Every batch of ``batch_grid`` with the spec's dispatch as the choice."""
    cases = config.lora_cases
    # Per (LoRA case, micro-batches), by size: a batch is only offered the
    # graphs at least as large (the oracle would drop the others anyway).
    buckets: dict[tuple[int, int], list[BatchDescriptor]] = {}
    for d in _captured(config, ruleset):
        buckets.setdefault((d.num_active_loras, d.num_ubatches), []).append(d)
    sizes = {}
    for key, bucket in buckets.items():
        bucket.sort(key=lambda d: d.num_tokens)
        sizes[key] = [d.num_tokens for d in bucket]
    rows = []
    for b in batch_grid(config, max_tokens):
        key = (lora_case(b.num_active_loras, cases), b.num_ubatches)
        bucket = buckets.get(key, [])
        fits = bucket[bisect.bisect_left(sizes.get(key, []), b.num_tokens):]
        choices = dispatch_choices(b, fits, cases)
        chosen = min(choices, key=desc_sort_key) if choices else eager_descriptor(b, cases)
        rows.append(DispatchRow(b, chosen, tuple(sorted(choices, key=desc_sort_key))))
    return rows


# -- findings -------------------------------------------------------------------------------------
def _finding_json(finding: Any) -> Mapping[str, Any]:
    return finding.to_json() if hasattr(finding, "to_json") else finding


def _dispatch_step(data: Mapping[str, Any]) -> tuple[Any, Batch | BatchShape] | None:
    """(Scenario, batch) of a finding about a batch dispatched while graphs
    are captured: a dispatch step's batch, or the smallest failing batch of
    a dispatch sweep after a capture (the step is then that capture).  None
    otherwise: before capture, after a release, no batch, no step."""
    from cgsim.scenario import Scenario, ScenarioError

    step = data.get("step")
    if not isinstance(step, int):
        return None
    try:
        scenario = Scenario.from_json(data.get("scenario"))
    except ScenarioError:
        return None
    if not 0 <= step < len(scenario.steps):
        return None
    facts = facts_of_old_finding(data)
    if "swept_after" in facts:
        if facts["swept_after"] != "capture" or scenario.steps[step].kind != "capture" or facts.get("batch") is None:
            return None
        return scenario, BatchShape.from_json(facts["batch"])
    if scenario.steps[step].batch is None:
        return None
    captured = False
    for s in scenario.steps[:step]:
        if s.kind == "capture":
            captured = True
        elif s.kind == "release":
            captured = False
    return (scenario, scenario.steps[step].batch) if captured else None


def sweep_rows(batches: Sequence[Batch | BatchShape], decisions: Sequence[BatchDescriptor],
               captured: Iterable[BatchDescriptor], lora_cases: Sequence[int]) -> list[DispatchRow]:
    """Rows from a dispatch sweep (a Trace ``Sweep``'s ``batches`` and
    ``descs``), each judged against ``captured`` (the spec's capture list, or
    what the target stored)."""
    captured = tuple(captured)
    rows = []
    for b, d in zip(batches, decisions, strict=True):
        rows.append(DispatchRow(b, d, tuple(sorted(dispatch_choices(b, captured, lora_cases), key=desc_sort_key))))
    return rows


def is_dispatch_picture_finding(finding: Any) -> bool:
    """Whether a finding gets a dispatch map: a dispatch-family property
    violated on a batch dispatched after a capture."""
    from cgsim.properties import ALL_PROPERTIES, resolve_alias

    data = _finding_json(finding)
    prop = ALL_PROPERTIES.get(resolve_alias(str(data.get("property", ""))))
    return prop is not None and prop.family == "dispatch" and _dispatch_step(data) is not None


def finding_mark(finding: Any) -> Mark | None:
    data = _finding_json(finding)
    found = _dispatch_step(data)
    if found is None:
        return None
    scenario, batch = found
    cfg = scenario.config
    expected = tuple(sorted(dispatch_choices(batch, _captured(cfg, scenario.ruleset), cfg.lora_cases), key=desc_sort_key))
    got = facts_of_old_finding(data).get("got")
    chosen = BatchDescriptor.from_json(got) if got is not None else None
    got = chosen.short() if chosen is not None else "see the message"
    want = " or ".join(d.short() for d in expected) if expected else "an eager run (no captured graph fits)"
    caption = f"{data.get('property')} at step {data.get('step')}: {batch.short()} went to {got}; the spec expects {want}"
    return Mark(batch, chosen, expected, caption)


def finding_rows(finding: Any) -> list[DispatchRow]:
    """The spec's map of the finding's config with the finding's batch where
    the target sent it (its descriptor as the property named it)."""
    data = _finding_json(finding)
    found = _dispatch_step(data)
    if found is None:
        return []
    scenario, _ = found
    mark = finding_mark(data)
    assert mark is not None
    rows = [r for r in spec_rows(scenario.config, scenario.ruleset) if not _same_cell(r.batch, mark.batch, scenario.config.lora_cases)]
    rows.append(DispatchRow(mark.batch, mark.chosen, mark.expected))
    return rows


# -- the picture -------------------------------------------------------------------------------
_NONE_RGB = (0.80, 0.80, 0.80)
_UNKNOWN_RGB = (0.10, 0.10, 0.10)
_MARK = "#d62728"
_FONT_PX = 10.5  # a 7 pt label at the default dpi; for fitting labels into regions


def _kind(b: Batch) -> tuple[int, str]:
    """(sort key, panel title) of a batch's kind."""
    if b.has_prefill:
        return (10**9, "prefill / mixed")
    u = b.uniform_token_count
    if u is not None:
        return (u, f"decode, query length {u}")
    return (10**9 - 1, "varlen decode")


def _panel_key(b: Batch, cases: Sequence[int]) -> tuple:
    order, title = _kind(b)
    return (lora_case(b.num_active_loras, cases), order, title)


def _same_cell(a: Batch, b: Batch, cases: Sequence[int]) -> bool:
    return _panel_key(a, cases) == _panel_key(b, cases) and a.num_reqs == b.num_reqs and a.num_tokens == b.num_tokens


def _label(d: BatchDescriptor) -> str:
    text = f"{d.cg_mode.value[0]}{d.num_tokens}"
    if d.num_reqs is not None and d.num_reqs * (d.uniform_token_count or 1) != d.num_tokens:
        text += f"·r{d.num_reqs}"
    if d.num_ubatches > 1:
        text += f"·u{d.num_ubatches}"
    return text


def _graph_order(d: BatchDescriptor) -> tuple:
    return (d.num_tokens, d.num_reqs or 0, d.uniform_token_count or 0, d.max_query_len or 0, d.num_ubatches)


def _palette(mpl: Any, descs: Iterable[BatchDescriptor]) -> dict[BatchDescriptor, tuple]:
    """Blues for FULL, Oranges for PIECEWISE, shade by rank in size (so the
    colours of neighbouring graphs differ as much as the count allows)."""
    out: dict[BatchDescriptor, tuple] = {}
    descs = set(descs)
    for mode, cmap_name in ((F, "Blues"), (P, "Oranges")):
        # By shape alone: one size has one shade in every LoRA case's panel.
        ranked = sorted({_graph_order(d) for d in descs if d.cg_mode == mode})
        cmap = mpl.colormaps[cmap_name]
        for d in descs:
            if d.cg_mode == mode:
                i = ranked.index(_graph_order(d))
                out[d] = tuple(cmap(0.30 + 0.62 * (i / max(1, len(ranked) - 1)))[:3])
    return out


def _waste_cmap() -> Any:
    # Purples without its near-white end: 5% waste must not look like none.
    from matplotlib import colormaps
    from matplotlib.colors import LinearSegmentedColormap

    base = colormaps["Purples"]
    return LinearSegmentedColormap.from_list("cgsim_waste", [base(0.18 + 0.82 * k / 15) for k in range(16)])


def _waste_pct(row: DispatchRow) -> float | None:
    d = row.chosen
    if d is None or d.cg_mode == N or d.num_tokens <= 0:
        return None
    pad_tokens, _ = padding_waste(d, row.batch)
    return 100.0 * max(0, pad_tokens) / d.num_tokens


def _is_marked(row: DispatchRow, mark: Mark | None) -> bool:
    return mark is not None and row.batch == mark.batch


@dataclass(frozen=True)
class _Grid:
    """The cell grid every panel shares: ``ts`` tokens by ``rs`` requests a cell."""

    ts: int
    rs: int
    n_t: int
    n_r: int

    @classmethod
    def of(cls, rows: Sequence[DispatchRow]) -> "_Grid":
        t_max = max(r.batch.num_tokens for r in rows)
        r_max = max(r.batch.num_reqs for r in rows)
        ts, rs = _step(t_max, MAX_TOKEN_CELLS), _step(r_max, MAX_REQ_CELLS)
        return cls(ts, rs, math.ceil(t_max / ts), math.ceil(r_max / rs))

    @property
    def extent(self) -> tuple[float, float, float, float]:
        return (0.5, 0.5 + self.n_t * self.ts, 0.5, 0.5 + self.n_r * self.rs)

    def x(self, j: float) -> float:
        return 0.5 + j * self.ts

    def y(self, i: float) -> float:
        return 0.5 + i * self.rs

    def cells(self, b: Batch) -> tuple[int, range]:
        """(row, columns) a batch covers.  A uniform decode batch of r requests
        spans the tokens between r-1 and r requests' worth (a staircase), so
        the decode panels are read like the others and are not one-token slivers."""
        i = (b.num_reqs - 1) // self.rs
        last = (b.num_tokens - 1) // self.ts
        u = b.uniform_token_count
        first = (b.num_tokens - u) // self.ts if u is not None else last
        return i, range(min(first, last), last + 1)


@dataclass
class _Panel:
    """One panel's cells: the row shown in each, graph ids, waste."""

    grid: _Grid
    rows: dict[tuple[int, int], DispatchRow]
    ids: Any
    rgb: Any
    waste: Any
    eager: Any
    unknown: Any
    wrong: list[tuple[float, float]]
    marked: tuple[int, range] | None


def _build_panel(grid: _Grid, rows: Sequence[DispatchRow], gid: Mapping, colors: Mapping, mark: Mark | None) -> _Panel:
    import numpy as np

    shown: dict[tuple[int, int], DispatchRow] = {}
    for row in rows:
        i, js = grid.cells(row.batch)
        for j in js:
            held = shown.get((i, j))
            # Several batches in one cell: the marked one, else one that disagrees with the spec.
            if held is not None and not _is_marked(row, mark) and (_is_marked(held, mark) or held.agrees is False or row.agrees is not False):
                continue
            shown[(i, j)] = row
    n_r, n_t = grid.n_r, grid.n_t
    p = _Panel(grid, shown, np.full((n_r, n_t), -1), np.ones((n_r, n_t, 3)), np.full((n_r, n_t), np.nan),
               np.zeros((n_r, n_t), dtype=bool), np.zeros((n_r, n_t), dtype=bool), [], None)
    none_id, unknown_id = len(gid), len(gid) + 1
    wrong: set[tuple[int, int]] = set()
    for (i, j), row in shown.items():
        d = row.chosen
        if d is None:
            p.rgb[i, j], p.ids[i, j], p.unknown[i, j] = _UNKNOWN_RGB, unknown_id, True
        elif d.cg_mode == N:
            p.rgb[i, j], p.ids[i, j], p.eager[i, j] = _NONE_RGB, none_id, True
        else:
            p.rgb[i, j], p.ids[i, j] = colors[d], gid[d]
        w = _waste_pct(row)
        if w is not None:
            p.waste[i, j] = w
        if _is_marked(row, mark):
            p.marked = grid.cells(row.batch)
        elif row.agrees is False and (i, row.batch.num_tokens) not in wrong:
            wrong.add((i, row.batch.num_tokens))
            p.wrong.append((row.batch.num_tokens, grid.y(i + 0.5)))
    return p


def _segments(grid: _Grid, a: Any, differs: Any) -> list:
    """Cell-edge segments where ``differs`` holds between horizontally and
    vertically adjacent cells of ``a`` (padded by one cell on each side)."""
    import numpy as np

    out = []
    for i, j in zip(*np.nonzero(differs(a[1:-1, 1:], a[1:-1, :-1]))):
        out.append([(grid.x(j), grid.y(i)), (grid.x(j), grid.y(i + 1))])
    for i, j in zip(*np.nonzero(differs(a[1:, 1:-1], a[:-1, 1:-1]))):
        out.append([(grid.x(j), grid.y(i)), (grid.x(j + 1), grid.y(i))])
    return out


def _graph_edges(p: _Panel) -> list:
    import numpy as np

    a = np.pad(p.ids, 1, constant_values=-1)
    return _segments(p.grid, a, lambda u, v: (u != v) & (u >= 0) & (v >= 0))


def _region_edges(p: _Panel, want: set) -> list:
    import numpy as np

    region = np.zeros(p.ids.shape, dtype=bool)
    for (i, j), row in p.rows.items():
        if row.chosen in want:
            region[i, j] = True
    if not region.any():
        return []
    return _segments(p.grid, np.pad(region, 1), lambda u, v: u != v)


class _Labels:
    """Region labels placed without overlapping each other (pixel boxes)."""

    def __init__(self, ax: Any, px_per_x: float, px_per_y: float):
        self.ax, self.px, self.py, self.boxes = ax, px_per_x, px_per_y, []

    def place(self, x: float, y: float, text: str, color: str, ha: str = "center") -> bool:
        w, h = 0.62 * _FONT_PX * len(text) + 2, _FONT_PX + 1
        cx = x * self.px + (w / 2 if ha == "left" else 0)
        box = (cx - w / 2, y * self.py - h / 2, cx + w / 2, y * self.py + h / 2)
        if any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in self.boxes):
            return False
        self.boxes.append(box)
        self.ax.text(x, y, text, ha=ha, va="center", fontsize=7, color=color, zorder=4, clip_on=True)
        return True


def _label_regions(ax: Any, p: _Panel, gid: Mapping, colors: Mapping, px: tuple[float, float], decode: bool) -> None:
    """One label per graph region: inside it where it fits, else (decode
    panels, where the space right of the staircase is empty) beside it."""
    import numpy as np

    labels = _Labels(ax, px[0] / p.grid.ts, px[1] / p.grid.rs)
    by_id = {i: d for d, i in gid.items()}
    regions = []
    for i in np.unique(p.ids):
        d = by_id.get(int(i))
        if d is not None:
            ys, xs = np.nonzero(p.ids == i)
            regions.append((-len(xs), d, ys, xs))
    for _, d, ys, xs in sorted(regions, key=lambda r: r[0]):  # biggest regions first
        text = _label(d)
        need = 0.62 * _FONT_PX * len(text) + 2
        rgb = colors[d]
        dark = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 0.55
        cy, cx = ys.mean(), xs.mean()
        k = int(np.argmin((ys - cy) ** 2 + (xs - cx) ** 2))
        row_cells = int(np.count_nonzero(ys == ys[k]))
        g = p.grid
        if row_cells * px[0] >= need and (ys.max() - ys.min() + 1) * px[1] >= _FONT_PX - 1:
            labels.place(g.x(xs[k] + 0.5), g.y(ys[k] + 0.5), text, "white" if dark else "#222222")
        elif decode:
            # Below and right of the region's middle step: the staircase
            # climbs up and right, so that corner is empty.
            right = xs[ys == ys[k]].max() + 1
            labels.place(g.x(right) + 0.3 * g.ts, g.y(ys[k]) - 0.5 * _FONT_PX / px[1] * g.rs, text, "#333333", ha="left")


def _ticks(ax: Any, capture_sizes: Sequence[int], t_extent: float, px_per_token: float) -> None:
    """Capture sizes as x ticks (the edges a reader looks for), filled up with
    round numbers, none closer than 18 pixels."""
    from matplotlib.ticker import MaxNLocator

    sizes = sorted(s for s in set(capture_sizes) if s <= t_extent)
    if len(sizes) > 12:
        sizes = []
    # Round numbers only where the capture sizes leave the axis bare.
    rounded = [int(v) for v in MaxNLocator(nbins=8 if len(sizes) < 3 else 3, integer=True).tick_values(1, t_extent)
               if 1 <= v <= t_extent]
    kept: list[int] = []
    for v in sorted(sizes, reverse=True) + sorted(set(rounded) - set(sizes), reverse=True):
        if all(abs(v - k) * px_per_token >= 18 for k in kept):
            kept.append(v)
    ax.set_xticks(sorted(kept))
    r_extent = ax.get_ylim()[1]
    ax.set_yticks([int(v) for v in MaxNLocator(nbins=6, integer=True).tick_values(1, max(1.0, r_extent - 0.5))
                   if 1 <= v <= r_extent])
    ax.tick_params(labelsize=8)


def render_dispatch_map(rows: Sequence[DispatchRow], *, fmt: str = "png", title: str = "",
                        lora_cases: Sequence[int] | None = None, capture_sizes: Sequence[int] = (),
                        mark: Mark | None = None, dpi: int = 110) -> bytes:
    """The dispatch map of ``rows`` as PNG or SVG bytes."""
    if fmt not in PICTURE_FORMATS:
        raise ValueError(f"picture format {fmt!r}: use one of {', '.join(PICTURE_FORMATS)}")
    if not rows:
        raise ValueError("a dispatch map needs at least one batch")
    mpl = require_matplotlib()
    import textwrap

    import numpy as np
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    cases = tuple(sorted(set(lora_cases))) if lora_cases else tuple(sorted({r.batch.num_active_loras for r in rows}))
    grid = _Grid.of(rows)
    by_panel: dict[tuple, list[DispatchRow]] = {}
    for row in rows:
        by_panel.setdefault(_panel_key(row.batch, cases), []).append(row)
    loras = sorted({k[0] for k in by_panel})
    kinds = sorted({(k[1], k[2]) for k in by_panel})
    graphs = {r.chosen for r in rows if r.chosen is not None and r.chosen.cg_mode != N}
    colors = _palette(mpl, graphs | ({d for d in mark.expected if d.cg_mode != N} if mark else set()))
    gid = {d: i for i, d in enumerate(sorted(colors, key=lambda d: (d.cg_mode.value, _graph_order(d))))}
    wrong_any = any(r.agrees is False and not _is_marked(r, mark) for r in rows)

    n_cols, n_rows = len(kinds), 2 * len(loras)
    panel_w, panel_h = 4.6, 2.3 + 1.0 * min(1.0, grid.n_r / max(1, grid.n_t))
    fig_w = panel_w * n_cols + 1.3
    width_chars = int((fig_w - 1.2) * 12.5)
    head = "\n".join(textwrap.wrap(title, width_chars))
    if mark is not None and mark.caption:
        head += "\n" + "\n".join(textwrap.wrap(mark.caption, width_chars))
    head_in = 0.42 + 0.19 * (head.count("\n") + 1)
    # The legend below the panels: as many entries a row as fit the width.
    modes = {r.chosen.cg_mode for r in rows if r.chosen is not None} | {d.cg_mode for d in colors}
    n_handles = len(modes) + 1 + any(r.chosen is None for r in rows) + wrong_any + (2 if mark is not None else 0)
    legend_cols = max(2, min(n_handles, int((fig_w - 0.4) / 2.5)))
    legend_rows = math.ceil(n_handles / legend_cols)
    foot_in = 0.62 + 0.2 + 0.2 * legend_rows  # tick labels and axis title, the note, the legend
    fig_h = panel_h * n_rows + head_in + foot_in
    from matplotlib.figure import Figure

    fig = Figure(figsize=(fig_w, fig_h))
    axes = fig.subplots(n_rows, n_cols, squeeze=False, sharex=True, sharey=True)
    left, right = 0.75 / fig_w, 1 - 1.0 / fig_w
    bottom, top = foot_in / fig_h, 1 - head_in / fig_h
    fig.subplots_adjust(left=left, right=right, bottom=bottom, top=top, hspace=0.34, wspace=0.07)
    # Pixels per cell, for fitting labels (axes fraction of the figure, times dpi).
    ax_w_px = (right - left) * fig_w * dpi / (n_cols + 0.07 * (n_cols - 1))
    ax_h_px = (top - bottom) * fig_h * dpi / (n_rows + 0.34 * (n_rows - 1))
    px = (ax_w_px / grid.n_t, ax_h_px / grid.n_r)
    extent = grid.extent
    waste_cmap = _waste_cmap()
    waste_image = None
    outlined = False
    for li, lora in enumerate(loras):
        for ki, (order, kind_title) in enumerate(kinds):
            ax_map, ax_waste = axes[2 * li][ki], axes[2 * li + 1][ki]
            p = _build_panel(grid, by_panel.get((lora, order, kind_title), []), gid, colors, mark)
            ax_map.imshow(p.rgb, origin="lower", extent=extent, aspect="auto", interpolation="nearest")
            edges = _graph_edges(p)
            if edges:
                ax_map.add_collection(LineCollection(edges, colors="white", linewidths=1.0))
            if mark is not None and p.marked is not None:
                around = _region_edges(p, set(mark.expected) - {mark.chosen})
                outlined = outlined or bool(around)
                if around:
                    ax_map.add_collection(LineCollection(around, colors=_MARK, linewidths=1.6, linestyles=(0, (3, 2)), zorder=5))
            _label_regions(ax_map, p, gid, colors, px, decode=order < 10**9 - 1)
            if p.wrong:
                xs, ys = zip(*p.wrong)
                ax_map.scatter(xs, ys, s=16, c=_MARK, marker="o", edgecolors="white", linewidths=0.6, zorder=5)
            # Waste: eager cells grey (no graph, so no padding), unknown black.
            bg = np.ones((grid.n_r, grid.n_t, 3))
            bg[p.eager] = _NONE_RGB
            bg[p.unknown] = _UNKNOWN_RGB
            ax_waste.imshow(bg, origin="lower", extent=extent, aspect="auto", interpolation="nearest")
            waste_image = ax_waste.imshow(np.ma.masked_invalid(p.waste), origin="lower", extent=extent, aspect="auto",
                                          interpolation="nearest", cmap=waste_cmap, vmin=0, vmax=100)
            if edges and len(set(p.ids.flat)) <= 24:  # more: the lines would hide the waste
                ax_waste.add_collection(LineCollection(edges, colors="white", linewidths=0.6))
            if p.marked is not None:
                i, js = p.marked
                x0, x1, y0 = grid.x(js.start), grid.x(js.stop), grid.y(i)
                for ax in (ax_map, ax_waste):
                    if (js.stop - js.start) * px[0] >= 9 and px[1] >= 9:
                        ax.add_patch(Rectangle((x0, y0), x1 - x0, grid.rs, fill=False, edgecolor=_MARK, linewidth=2.4, zorder=6))
                    else:  # a cell too small to box: a marker of fixed size around it
                        ax.plot([(x0 + x1) / 2], [y0 + grid.rs / 2], marker="s", markersize=11, markerfacecolor="none",
                                markeredgecolor=_MARK, markeredgewidth=2, zorder=6)
            lora_title = f" · LoRA case {lora}" if len(cases) > 1 else ""
            ax_map.set_title(f"{kind_title}{lora_title}: the graph each batch lands on", fontsize=9)
            ax_waste.set_title(f"{kind_title}{lora_title}: padding waste", fontsize=9)
            for ax in (ax_map, ax_waste):
                ax.set_xlim(extent[0], extent[1])
                ax.set_ylim(extent[2], extent[3])
                _ticks(ax, capture_sizes, extent[1], px[0] / grid.ts)
                for spine in ax.spines.values():
                    spine.set_color("#999999")
            if ki == 0:
                ax_map.set_ylabel("requests", fontsize=9)
                ax_waste.set_ylabel("requests", fontsize=9)
            if li == len(loras) - 1:
                ax_waste.set_xlabel("batch tokens", fontsize=9)
                ax_waste.tick_params(labelbottom=True)
    handles = [h for m, h in (
        (F, Patch(facecolor=mpl.colormaps["Blues"](0.75), label="FULL graph")),
        (P, Patch(facecolor=mpl.colormaps["Oranges"](0.6), label="PIECEWISE graph")),
        (N, Patch(facecolor=_NONE_RGB, label="NONE: eager, no graph")),
    ) if m in modes]
    handles.append(Patch(facecolor="white", edgecolor="#999999", label="no batch in this cell"))
    if any(r.chosen is None for r in rows):
        handles.append(Patch(facecolor=_UNKNOWN_RGB, label="graph not known"))
    if wrong_any:
        handles.append(Line2D([], [], marker="o", color="white", markerfacecolor=_MARK, markersize=6,
                              label="graph disagrees with the spec"))
    if mark is not None:
        handles.append(Patch(facecolor="none", edgecolor=_MARK, linewidth=2.0, label="the finding's batch (where it went)"))
        if outlined:
            handles.append(Patch(facecolor="none", edgecolor=_MARK, linestyle="--", linewidth=1.4,
                                 label="batches on the graph that should serve it"))
    fig.legend(handles=handles, loc="lower center", ncol=legend_cols, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    note = "shade: graph size (darker = larger) · label: mode letter + graph tokens (·r requests, ·u micro-batches)"
    if grid.ts > 1 or grid.rs > 1:
        note += f" · one cell per {grid.ts} tokens x {grid.rs} requests (sampled)"
    fig.text(0.5, (0.12 + 0.2 * legend_rows) / fig_h, note, ha="center", va="bottom", fontsize=7.5, color="#444444")
    fig.text(left, 1 - 0.12 / fig_h, head, ha="left", va="top", fontsize=9.5)
    if waste_image is not None:
        cax = fig.add_axes((right + 0.25 / fig_w, bottom, 0.12 / fig_w, top - bottom))
        cbar = fig.colorbar(waste_image, cax=cax)
        cbar.set_label("padding waste: padded tokens / graph tokens (%)", fontsize=8)
        cbar.ax.tick_params(labelsize=7)
    buf = io.BytesIO()
    # SVG text stays text (searchable, selectable, small), not glyph paths.
    with mpl.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format=fmt, dpi=dpi, metadata={"Software": None} if fmt == "png" else {"Date": None})
    return buf.getvalue()


def picture_format(path: str) -> str:
    """``png`` or ``svg`` from a file name; ValueError naming the fix otherwise."""
    fmt = os.path.splitext(path)[1].lower().lstrip(".")
    if fmt not in PICTURE_FORMATS:
        raise ValueError(f"{path!r}: a picture is written as .png or .svg; give a file name ending in one of them")
    return fmt


def save_dispatch_map(rows: Sequence[DispatchRow], path: str, **kw: Any) -> None:
    """Write the map to ``path``; the format is its suffix (.png or .svg)."""
    from cgsim.report.atomic import atomic_write_bytes

    fmt = picture_format(path)
    atomic_write_bytes(path, render_dispatch_map(rows, fmt=fmt, **kw))


def _config_title(config: ManagerConfig, ruleset: str) -> str:
    mode = resolved_mode(config)
    shown = config.mode.value if mode == config.mode else f"{config.mode.value} -> {mode.value}"
    q = config.decode_query_len if config.spec_schedule is None else f"{list(config.scheduler_decode_query_lens())} (schedule)"
    sizes = sorted(config.capture_sizes)
    sizes_text = (f"capture sizes {sizes}" if len(sizes) <= 12 else
                  f"{len(sizes)} capture sizes [{', '.join(map(str, sizes[:5]))}, ..., {', '.join(map(str, sizes[-2:]))}]")
    parts = [f"{shown}", sizes_text, f"max_num_reqs {config.max_num_reqs}",
             f"decode query length {q}"]
    if len(config.lora_cases) > 1:
        parts.append(f"LoRA cases {list(config.lora_cases)}")
    if config.breakable:
        parts.append("breakable")
    if config.varlen_decode:
        parts.append("varlen decode")
    if config.num_ubatches > 1:
        parts.append(f"{config.num_ubatches} micro-batches from {config.ubatch_threshold} tokens")
    return f"Where batches go (spec, ruleset {ruleset}): " + ", ".join(parts)


def explain_picture(config: ManagerConfig, ruleset: str, fmt: str = "png", max_tokens: int | None = None) -> bytes:
    """What ``fuzz explain --plot`` draws: the spec's map of one config."""
    return render_dispatch_map(spec_rows(config, ruleset, max_tokens), fmt=fmt, title=_config_title(config, ruleset),
                               lora_cases=config.lora_cases, capture_sizes=config.capture_sizes)


def finding_picture(finding: Any, fmt: str = "png") -> bytes | None:
    """The map of a dispatch finding's config with its batch marked (None:
    not a dispatch finding, see is_dispatch_picture_finding)."""
    if not is_dispatch_picture_finding(finding):
        return None
    data = _finding_json(finding)
    scenario, _ = _dispatch_step(data)  # type: ignore[misc]
    mark = finding_mark(data)
    title = f"{data.get('id') or data.get('property')} on {data.get('target')}: " + _config_title(scenario.config, scenario.ruleset)
    return render_dispatch_map(finding_rows(data), fmt=fmt, title=title, lora_cases=scenario.config.lora_cases,
                               capture_sizes=scenario.config.capture_sizes, mark=mark)
