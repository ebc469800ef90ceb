"""SGLang's CUDA-graph rules (the ``sglang*`` rulesets), written out from its
code (``get_batch_sizes_to_capture``, ``generate_decode_cuda_graph_batch_sizes``,
the prefill runner's bucket list, the runners' ``can_run_graph`` and bisect
padding) rather than by calling it, so that an SGLang whose code drifts from
them disagrees with this module.

Where releases chose differently, the choice is a rule of the release's
design (``SglangDesign``, one per ``sglang*`` ruleset; ``SGL_RULES`` cites the
release range and the code of each): a campaign judges a release by its own
design (``cgsim.targets.sglang.compat.DESIGNS`` says which release follows
which).

How a cgsim config reads for SGLang (the mapping every sglang target uses):

- the requested mode names the two runners' backends: its decode part the
  decode runner's (FULL -> ``full``, PIECEWISE -> ``breakable``), its mixed
  part the prefill runner's (FULL -> ``full`` with request slots,
  PIECEWISE -> ``breakable``); NONE disables a runner.  Without a piecewise
  capture (``piecewise_available`` False) breakable runners are disabled,
  the SPEC §2 drop;
- ``capture_sizes``: the decode runner's bs list and the prefill runner's
  token list (``sglang.default_bs_list``: the decode list is SGLang's default
  ladder up to --cuda-graph-max-bs = max(capture_sizes));
- ``max_num_reqs``: the request pool (req_to_token_pool.size);
- ``decode_query_len``: the decode graphs' width (EAGLE target verify with
  that many draft tokens when > 1);
- ``lora_cases`` (0,) or (0, k): no LoRA, or LoRA with k adapters; graphs
  with the LoRA kernels carry num_active_loras=k, base-only ("nolora")
  graphs 0;
- ``num_ubatches`` 2: two-batch overlap (decode graphs run two micro-batches);
- ``sglang.dp_size`` > 1: data-parallel attention over that many ranks
  (attention TP 1); rank r runs ``dp_rank_sizes`` requests.

Graphs as descriptors: a decode graph of bs requests is
``FULL(num_tokens=bs*w, num_reqs=bs, uniform_token_count=w)``; a prefill graph
of n tokens is ``PIECEWISE(num_tokens=n)`` (breakable) or
``FULL(num_tokens=n, num_reqs=slots)`` (full).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Iterable

from cgsim.config import ManagerConfig
from cgsim.descriptors import BatchDescriptor
from cgsim.modes import CUDAGraphMode
from cgsim.spec.rulesets import Rule, Ruleset
from cgsim.spec.sglang_options import SglangOptions

__all__ = [
    "FULL_BACKEND", "BREAKABLE", "DISABLED", "MAX_PREFILL_PADDING_FACTOR",
    "options", "runner_backends", "alignment", "batch_size_alignment", "alignment_width", "ALIGNMENT_HELPER",
    "ceil_align", "lora_case_of", "default_decode_bs",
    "requested_decode_bs", "decode_capture_bs", "prefill_capture_tokens", "prefill_slots",
    "expected_capture_descs", "decode_desc", "prefill_desc", "dp_rank_sizes", "Graphs", "expected_dispatch",
    "is_decode_desc", "is_decode_batch", "unsupported_reason", "resolved_mode",
    "SglangDesign", "SGL_RULES", "DESIGNS", "LATEST", "design_of", "records_nolora",
    "eagle_topk", "eagle_steps", "draft_decode_config", "DRAFT_DECODE", "draft_extend_config", "DRAFT_EXTEND",
]

F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
FULL_BACKEND, BREAKABLE, DISABLED = "full", "breakable", "disabled"
# A prefill batch replays only if its bucket holds at most this many times its tokens.
MAX_PREFILL_PADDING_FACTOR = 2


SGL_RULES: dict[str, Rule] = {r.field: r for r in (
    Rule("nolora_from_backend",
         "with LoRA, a LoRA backend that skips inactive dense LoRA (--lora-backend triton_v2) makes the decode "
         "runner record a base-only (\"nolora\") graph beside each LoRA graph, which batches without an active "
         "adapter replay (False: the runner records nolora graphs only when its constructor is asked to, which the "
         "server's capture_decode_graph never does: one graph per bs)",
         "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py DecodeCudaGraphRunner.__init__: "
         "record_nolora_graph = record_nolora_graph or _lora_backend_skips_inactive(model_runner) (0.5.23); "
         "0.5.20-0.5.22: record_nolora_graph = record_nolora_graph (the keyword only)",
         "the triton_v2 LoRA backend (0.5.23) skips inactive dense LoRA, so a graph captured with the LoRA "
         "kernels would skip them for every replay; the base-only graph keeps adapter-free batches correct"),
    Rule("aligned_prefill_tokens",
         "prefill buckets are the capture sizes rounded up to the batch-size alignment (False: the sizes as "
         "listed)",
         "sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py get_prefill_num_tokens_to_capture, "
         "called by PrefillCudaGraphRunner.__init__ (0.5.22+); 0.5.20-0.5.21: capture_num_tokens = "
         "sorted(capture_tokens)",
         "dummy capture batches bypass eager padding, and unequal TP/CP token shards mismatch collectives "
         "(the helper's docstring)"),
)}


@dataclass(frozen=True)
class SglangDesign:
    """The choices one range of sglang releases made (``SGL_RULES`` says what
    each field means and where it comes from)."""

    ruleset: str
    releases: str
    nolora_from_backend: bool
    aligned_prefill_tokens: bool

    def rules(self) -> list[tuple[Rule, object]]:
        return [(SGL_RULES[f], getattr(self, f)) for f in SGL_RULES]


DESIGNS: dict[str, SglangDesign] = {d.ruleset: d for d in (
    SglangDesign("sglang-0.5.20", "sglang 0.5.20-0.5.21", nolora_from_backend=False, aligned_prefill_tokens=False),
    SglangDesign("sglang-0.5.22", "sglang 0.5.22", nolora_from_backend=False, aligned_prefill_tokens=True),
    SglangDesign("sglang", "sglang 0.5.23", nolora_from_backend=True, aligned_prefill_tokens=True),
)}
LATEST = DESIGNS["sglang"]


def design_of(ruleset: "Ruleset | str") -> SglangDesign:
    """The sglang design a ruleset states (ValueError for another engine's)."""
    name = ruleset if isinstance(ruleset, str) else ruleset.name
    try:
        return DESIGNS[name]
    except KeyError:
        raise ValueError(f"ruleset {name!r} states no sglang design; use one of {', '.join(DESIGNS)}") from None


def options(config: ManagerConfig) -> SglangOptions:
    """The config's SGLang options (the defaults where it holds none)."""
    return config.options(SglangOptions) or SglangOptions()


def ceil_align(x: int, base: int) -> int:
    return -(-x // base) * base


def _part(mode: CUDAGraphMode, piecewise_available: bool) -> str:
    if mode == F:
        return FULL_BACKEND
    if mode == P:
        return BREAKABLE if piecewise_available else DISABLED
    return DISABLED


def runner_backends(config: ManagerConfig) -> tuple[str, str]:
    """(decode backend, prefill backend) for the config's requested mode."""
    mode = config.mode
    return (_part(mode.decode_mode(), config.piecewise_available),
            _part(mode.mixed_mode(), config.piecewise_available))


def resolved_mode(config: ManagerConfig) -> CUDAGraphMode:
    """The mode the two backends amount to (what the target reports)."""
    decode, prefill = runner_backends(config)
    as_mode = {FULL_BACKEND: F, BREAKABLE: P, DISABLED: N}
    return CUDAGraphMode.from_parts(as_mode[decode], as_mode[prefill])


def unsupported_reason(config: ManagerConfig) -> str | None:
    """Why a config says something SGLang has no counterpart for (None: it maps)."""
    if config.attention_support.name != "ALWAYS":
        return (f"attention_support {config.attention_support.name}: SGLang attention backends declare no "
                "vLLM CUDA-graph support level; the SGLang driver's attention backend supports every graph (ALWAYS)")
    if config.varlen_decode:
        return "varlen_decode: SGLang decode graphs have one width per runner (no adaptive verification)"
    if config.spec_schedule is not None:
        return "spec_schedule: SGLang has no dynamic speculative decoding schedule"
    if len(config.lora_cases) > 2:
        return (f"lora_cases {list(config.lora_cases)}: SGLang captures one graph per bs with the LoRA kernels "
                "(and a base-only one): use (0,) or (0, k)")
    if config.num_ubatches > 2:
        return f"num_ubatches {config.num_ubatches}: SGLang's two-batch overlap splits into exactly 2"
    opts = options(config)
    if config.decode_query_len > 1 and opts.eagle_topk == 1 and opts.eagle_steps not in (None, config.decode_query_len - 1):
        # arg_groups/speculative_hook.py _handle_eagle_family (0.5.23: :1255-1266).
        return (f"eagle_steps {opts.eagle_steps} with topk 1 and {config.decode_query_len} draft tokens: SGLang sets a "
                "chain's draft tokens to steps + 1")
    return None


# The engine function whose answer the sglang target records (trace.EngineAlignment.helper)
# and this module's batch_size_alignment writes out.
ALIGNMENT_HELPER = "sglang.srt.utils.common.get_cuda_graph_batch_size_alignment"


def batch_size_alignment(two_batch_overlap: bool, gathered_buffer: bool, attn_tp_size: int = 1,
                         attn_cp_size: int = 1) -> int:
    """get_cuda_graph_batch_size_alignment (sglang/srt/utils/common.py, 0.5.23:
    4168-4182): 2 under two-batch overlap, times the attention TP size when the
    runner needs gathered buffers, times the attention CP size where the
    product is not already a multiple of it (on CUDA; ROCm skips that step).
    The decode runner passes its own gather need (``decode_graph_gather_requirements``),
    the prefill runner's bucket helper and the draft runners none (the
    process's ``require_gathered_buffer``).  The sglang target records what
    sglang's function answers (``EngineAlignment``), and
    tests/cgsim/targets/sglang/test_sglang_alignment.py holds this copy to it."""
    out = 2 if two_batch_overlap else 1
    if gathered_buffer:
        out *= attn_tp_size
    if out % attn_cp_size:
        out *= attn_cp_size
    return out


def alignment(config: ManagerConfig) -> int:
    """The alignment for a cgsim config: ``batch_size_alignment`` with two-batch
    overlap from ``num_ubatches`` and attention TP 1 (cgsim's DP ranks run
    attention TP 1, so a gathered buffer multiplies by 1; no attention CP).
    The properties judge by the engine's recorded answer where the trace has
    one (``Trace.alignment``), by this where it has none."""
    return batch_size_alignment(config.num_ubatches == 2, options(config).dp_size > 1)


def alignment_width(config: ManagerConfig) -> int:
    """The width a decode graph's bs is aligned by (get_batch_sizes_to_capture,
    base_cuda_graph_runner.py 0.5.23: 86-90): the decode width, 1 under
    two-batch overlap (it splits requests, not rows)."""
    return 1 if config.num_ubatches == 2 else config.decode_query_len


def lora_case_of(config: ManagerConfig) -> int:
    """The adapter count graphs with LoRA kernels are captured for (0: no LoRA)."""
    return max(config.lora_cases)


def default_decode_bs(max_bs: int, disable_padding: bool, speculative: bool) -> list[int]:
    """generate_decode_cuda_graph_batch_sizes: every size without padding; else
    a ladder (finer for speculative decoding), cut at max_bs, and max_bs itself
    always (a server asking for --cuda-graph-max-bs 20 gets a graph for 20)."""
    if disable_padding:
        sizes = list(range(1, max_bs + 1))
    elif not speculative:
        sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    else:
        sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
                 + list(range(272, max_bs + 1, 16)))
    sizes = [s for s in sizes if s <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def requested_decode_bs(config: ManagerConfig) -> list[int]:
    opts = options(config)
    if opts.default_bs_list:
        return default_decode_bs(max(config.capture_sizes), opts.disable_padding, config.decode_query_len > 1)
    return list(config.capture_sizes)


def decode_capture_bs(config: ManagerConfig, align: int | None = None) -> tuple[int, ...]:
    """get_batch_sizes_to_capture: the request pool rounded up to the alignment
    (and added when the list asks for more), every size whose tokens
    (bs x width; bs alone under two-batch overlap, which splits requests) are a
    multiple of the alignment, none above the rounded pool, sorted, unique.
    ``align``: the engine's own alignment where it was recorded (else ``alignment``)."""
    base = alignment(config) if align is None else align
    width = alignment_width(config)
    pool = ceil_align(config.max_num_reqs, base)
    sizes = requested_decode_bs(config)
    if max(sizes) > pool:
        sizes = sizes + [pool]
    return tuple(sorted({s for s in sizes if s * width % base == 0 and s <= pool}))


def prefill_capture_tokens(config: ManagerConfig, design: SglangDesign, align: int | None = None) -> tuple[int, ...]:
    """The prefill runner's buckets: each size rounded up to the alignment
    (get_prefill_num_tokens_to_capture), or as listed (``aligned_prefill_tokens``).
    ``align``: the engine's own prefill alignment where it was recorded."""
    base = (alignment(config) if align is None else align) if design.aligned_prefill_tokens else 1
    return tuple(sorted({ceil_align(n, base) for n in config.capture_sizes}))


def prefill_slots(config: ManagerConfig) -> int:
    """Request slots of a FULL prefill graph (at most the request pool)."""
    slots = options(config).full_prefill_max_req
    return min(slots if slots is not None else config.max_num_reqs, config.max_num_reqs)


def records_nolora(config: ManagerConfig, design: SglangDesign) -> bool:
    """Whether the decode runner records a base-only graph beside each LoRA graph."""
    return lora_case_of(config) > 0 and design.nolora_from_backend and options(config).record_nolora_graph


def _lora_variants(config: ManagerConfig, design: SglangDesign) -> tuple[int, ...]:
    """num_active_loras of the decode graphs captured per bs, in capture order:
    ("lora", "nolora") with a base-only graph, else the one graph."""
    k = lora_case_of(config)
    if k == 0:
        return (0,)
    return (k, 0) if records_nolora(config, design) else (k,)


def decode_desc(config: ManagerConfig, bs: int, loras: int) -> BatchDescriptor:
    w = config.decode_query_len
    mode = F if runner_backends(config)[0] == FULL_BACKEND else P
    return BatchDescriptor(mode, bs * w, bs, w, None, loras, 2 if config.num_ubatches == 2 else 1)


def prefill_desc(config: ManagerConfig, tokens: int) -> BatchDescriptor:
    _, prefill = runner_backends(config)
    loras = lora_case_of(config)
    if prefill == FULL_BACKEND:
        return BatchDescriptor(F, tokens, prefill_slots(config), None, None, loras)
    return BatchDescriptor(P, tokens, None, None, None, loras)


def is_decode_desc(d: BatchDescriptor) -> bool:
    return d.uniform_token_count is not None


def expected_capture_descs(config: ManagerConfig, design: SglangDesign, decode_align: int | None = None,
                           prefill_align: int | None = None) -> tuple[BatchDescriptor, ...]:
    """Every graph, in SGLang's capture order: the prefill runner first (its
    buckets largest first), then the decode runner (largest bs first; per bs
    the LoRA graph, then the base-only one).  capture_cuda_graphs builds the
    prefill runner before the decode runner so both coalesce onto the eager
    runner's buffer; inside a runner large shapes go first so smaller ones
    reuse their pool memory.  ``decode_align`` / ``prefill_align``: the engine's
    own alignments where they were recorded (else ``alignment``)."""
    decode, prefill = runner_backends(config)
    out: list[BatchDescriptor] = []
    if prefill != DISABLED:
        out += [prefill_desc(config, n) for n in sorted(prefill_capture_tokens(config, design, prefill_align),
                                                        reverse=True)]
    if decode != DISABLED:
        variants = _lora_variants(config, design)
        out += [decode_desc(config, bs, v) for bs in sorted(decode_capture_bs(config, decode_align), reverse=True)
                for v in variants]
    return tuple(out)


def is_decode_batch(config: ManagerConfig, batch) -> bool:
    """A decode (or verify) step for sglang: no prefill and every request at the
    decode width.  Anything else is an extend for sglang's prefill runner."""
    return not batch.has_prefill and batch.uniform_token_count == config.decode_query_len


def dp_rank_sizes(num_reqs: int, dp_size: int, pool: int) -> tuple[int, ...]:
    """Requests per DP rank for a step whose rank 0 runs ``num_reqs``: rank r
    runs the r-th count above it, wrapping past the request pool to 1.  A peer
    mostly holds more requests than rank 0, so the group's graph (the max over
    ranks) is not rank 0's own bucket, and the ranks' sum grows with the group."""
    return tuple(1 + (num_reqs - 1 + r) % max(pool, 1) for r in range(dp_size))


@dataclass(frozen=True)
class Graphs:
    """What a capture left, by runner (sizes sorted for the bisect)."""

    decode: frozenset[BatchDescriptor]
    prefill: frozenset[BatchDescriptor]
    decode_sizes: tuple[int, ...]
    prefill_tokens: tuple[int, ...]

    @classmethod
    def of(cls, descs: Iterable[BatchDescriptor]) -> "Graphs":
        descs = frozenset(descs)
        decode = frozenset(d for d in descs if is_decode_desc(d))
        prefill = descs - decode
        return cls(decode, prefill, tuple(sorted({d.num_reqs for d in decode})),
                   tuple(sorted({d.num_tokens for d in prefill})))


def expected_dispatch(config: ManagerConfig, graphs: Graphs, batch, design: SglangDesign) -> BatchDescriptor | None:
    """The graph SGLang's rules replay ``batch`` on (a Batch or BatchShape), or
    None for eager.

    A decode batch (no prefill, the decode width) goes to the decode runner:
    under two-batch overlap only if the scheduler split it; its size is the
    max over DP ranks; with padding disabled only an exactly captured key
    replays, else any size up to the largest captured bs does, padded to the
    smallest captured bs >= it (bisect).  Its LoRA variant: the LoRA graph if
    any request has an adapter, the base-only graph if not (one graph for both
    unless the design records base-only graphs, ``records_nolora``).  Any other batch is an extend for the
    prefill runner: up to its largest bucket, padded to the smallest bucket >= its
    tokens, unless that bucket is more than twice its tokens; FULL prefill
    graphs hold at most their request slots.  Anything else runs eagerly."""
    opts = options(config)
    if is_decode_batch(config, batch):
        if not graphs.decode:
            return None
        if config.num_ubatches == 2 and batch.num_ubatches != 2:
            return None
        n = max(dp_rank_sizes(batch.num_reqs, opts.dp_size, config.max_num_reqs))
        k = lora_case_of(config)
        loras = 0 if k == 0 else (k if batch.num_active_loras > 0 or not records_nolora(config, design) else 0)
        if opts.disable_padding:
            want = decode_desc(config, n, loras)
            return want if want in graphs.decode else None
        sizes = graphs.decode_sizes
        if n > sizes[-1]:
            return None
        return decode_desc(config, sizes[bisect_left(sizes, n)], loras)
    if not graphs.prefill:
        return None
    tokens = graphs.prefill_tokens
    t = batch.num_tokens
    if t > tokens[-1]:
        return None
    bucket = tokens[bisect_left(tokens, t)]
    if bucket > MAX_PREFILL_PADDING_FACTOR * t:
        return None
    want = prefill_desc(config, bucket)
    if want.num_reqs is not None and batch.num_reqs > want.num_reqs:
        return None
    return want


# -- EAGLE's draft decode runner (EAGLEDraftCudaGraphRunner) -----------------------
# The sub-trace name of the draft model's decode runner ("draft-*": a draft manager).
DRAFT_DECODE = "draft-decode"


def eagle_topk(config: ManagerConfig) -> int:
    """--speculative-eagle-topk: draft tokens each request proposes per draft step."""
    return options(config).eagle_topk


def eagle_steps(config: ManagerConfig) -> int:
    """--speculative-num-steps: draft steps per round (given, or the chain's
    draft tokens - 1 when topk is 1)."""
    steps = options(config).eagle_steps
    return steps if steps is not None else config.decode_query_len - 1


def draft_decode_config(config: ManagerConfig) -> ManagerConfig | None:
    """The config EAGLE's draft decode runner works with (None: the server builds
    none for ``config``).

    - It exists only with EAGLE (decode_query_len > 1), a decode runner that is
      not disabled and more than one draft step: EagleDraftWorker._capture_cuda_graphs
      (speculative/eagle_worker_v2.py:476-514) returns when the decode backend is
      disabled and builds no draft decode runner for speculative_num_steps == 1.
    - Its graphs are keyed by bs alone and hold bs x topk tokens: the width is
      resolve_num_tokens_per_req(phase="draft_decode") = speculative_eagle_topk
      (speculative/spec_utils.py:100-101; eagle_draft_cuda_graph_runner.py:159-161),
      the key ShapeKey(size=bs) (eagle_draft_cuda_graph_runner.py:319-321, no
      sampling variant without rejection sampling: :323-333).
    - Its bs list is get_batch_sizes_to_capture(draft model runner) with the
      default captured_req_width 1 (eagle_draft_cuda_graph_runner.py:157;
      runner/base_cuda_graph_runner.py:65-110): the server's decode bs list
      (the same cuda_graph_config.decode.bs), the request pool (the draft
      worker shares the target's req_to_token_pool) rounded to the alignment
      and added when the list asks for more, sizes aligned as bs x 1.
    - A draft batch replays the smallest captured bs >= its requests, up to the
      largest (can_run_graph: cuda_graph_bs <= max_bs, :338-373; execute pads with
      _pad_to_bucket, :579-589); with padding disabled only an exactly captured
      bs (backend.can_run of its key, :356-366); a batch of another width runs
      eagerly (:341-348).
    Expressed as a FULL decode-only config of width topk over the same requested
    sizes (the default ladder resolved for the speculative server), without
    LoRA, two-batch overlap or DP (the driver runs the draft runner without
    them: ``cgsim.targets.sglang._draft.draft_limits``)."""
    decode, _ = runner_backends(config)
    if config.decode_query_len < 2 or decode == DISABLED or eagle_steps(config) < 2:
        return None
    opts = options(config)
    return ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY if decode == FULL_BACKEND else CUDAGraphMode.PIECEWISE,
                         capture_sizes=tuple(requested_decode_bs(config)), max_num_reqs=config.max_num_reqs,
                         decode_query_len=eagle_topk(config),
                         engine_options=(SglangOptions(disable_padding=opts.disable_padding),))


# -- EAGLE's draft extend runner (EAGLEDraftExtendCudaGraphRunner) -------------------
DRAFT_EXTEND = "draft-extend"


def draft_extend_config(config: ManagerConfig) -> ManagerConfig | None:
    """The config EAGLE's draft extend runner works with (None: the server builds
    none for ``config``).

    - It exists with EAGLE and a decode runner that is not disabled, whatever
      the draft steps (EagleDraftWorker._capture_cuda_graphs, eagle_worker_v2.py:
      476-478 returns before both runners; 603-619 builds it for a draft extend
      attention backend of a graph-supported type, which cgsim's toy backend
      stands for, unless SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH).
    - Its graphs are keyed by bs alone and hold bs x draft tokens: the width is
      resolve_num_tokens_per_req(phase="draft_extend") = speculative_num_draft_tokens
      (spec_utils.py:102-103; eagle_draft_extend_cuda_graph_runner.py:152-156),
      the key ShapeKey(size=bs) (:316-317).
    - Its bs list is get_batch_sizes_to_capture(draft model runner), width 1
      (:150), as the draft decode runner's.
    - A batch replays the smallest captured bs >= its requests up to the largest,
      with padding disabled only an exactly captured bs, a batch of another
      width eagerly (can_run_graph :319-348; execute's _pad_to_bucket :526-537);
      it hands back one row per request (:684-689).
    The same FULL decode-only shape as the draft decode runner's config, of
    width draft tokens."""
    decode, _ = runner_backends(config)
    if config.decode_query_len < 2 or decode == DISABLED:
        return None
    opts = options(config)
    return ManagerConfig(mode=CUDAGraphMode.FULL_DECODE_ONLY if decode == FULL_BACKEND else CUDAGraphMode.PIECEWISE,
                         capture_sizes=tuple(requested_decode_bs(config)), max_num_reqs=config.max_num_reqs,
                         decode_query_len=config.decode_query_len,
                         engine_options=(SglangOptions(disable_padding=opts.disable_padding),))
