"""``python -m fuzz explain``: what the spec says a config captures and where
every batch shape goes.  Built only from cgsim.spec (no target runs), so it
shows the intended behaviour a target is checked against."""

from __future__ import annotations

from typing import Any

from cgsim.config import ManagerConfig
from cgsim.descriptors import Batch, BatchDescriptor
from cgsim.spec.fit import padding_waste
from cgsim.spec import expected_candidate_tiers, expected_capture_order, expected_dispatch, resolved_mode

__all__ = ["explain_config", "explain_text", "write_plot", "representative_batches"]


def representative_batches(config: ManagerConfig, n: int, lora: int = 0) -> list[tuple[str, Batch]]:
    """The batch kinds of ``n`` tokens a scheduler produces: uniform decode at
    every decode query length, one prefill, and a mixed batch."""
    out: list[tuple[str, Batch]] = []
    for q in config.scheduler_decode_query_lens():
        if n % q == 0 and n // q <= config.max_num_reqs and config.scheduler_decode_query_len(n // q) == q:
            out.append((f"decode q={q}", Batch.uniform(n // q, q, num_active_loras=lora)))
    if not any(kind == "decode q=1" for kind, _ in out) or n > 1:
        if n >= 2 or not out:
            out.append(("prefill", Batch((n,), num_active_loras=lora, has_prefill=True)))
    reqs = min(config.max_num_reqs, n - 1)
    if reqs >= 2 and n - (reqs - 1) >= 2:
        out.append((f"mixed r={reqs}", Batch((n - (reqs - 1),) + (1,) * (reqs - 1), num_active_loras=lora, has_prefill=True)))
    return out


def explain_config(config: ManagerConfig, ruleset: str = "pr48822", lora: int = 0, max_tokens: int | None = None) -> dict:
    mode = resolved_mode(config)
    captured = expected_capture_order(config, ruleset)
    tiers = expected_candidate_tiers(config, ruleset)
    largest = config.max_capture_size or max(config.capture_sizes)
    limit = min(largest, max_tokens) if max_tokens else largest

    candidates: list[dict] = []
    for (n, case), tier_list in sorted(tiers.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        shown = [sorted(d.short() for d in tier) for tier in tier_list]
        last = candidates[-1] if candidates else None
        if last and last["lora"] == case and last["tiers"] == shown and last["tokens_to"] == n - 1:
            last["tokens_to"] = n
        else:
            candidates.append({"lora": case, "tokens_from": n, "tokens_to": n, "tiers": shown})

    rows: list[dict] = []
    for n in range(1, limit + 1):
        for kind, batch in representative_batches(config, n, lora):
            desc: BatchDescriptor = expected_dispatch(batch, captured, config.lora_cases)
            pad_t, pad_r = padding_waste(desc, batch) if desc.cg_mode.value != "NONE" else (0, 0)
            rows.append(
                {
                    "num_tokens": n,
                    "kind": kind,
                    "num_reqs": batch.num_reqs,
                    "mode": desc.cg_mode.value,
                    "graph": desc.short(),
                    "graph_tokens": desc.num_tokens,
                    "pad_tokens": pad_t,
                    "pad_reqs": pad_r,
                    "waste_pct": round(100.0 * pad_t / desc.num_tokens, 1) if desc.num_tokens else 0.0,
                }
            )
    return {
        "config": config.to_json(),
        "ruleset": ruleset,
        "requested_mode": config.mode.value,
        "resolved_mode": mode.value,
        "capture_list": [{"order": i, "desc": d.short(), **d.to_json()} for i, d in enumerate(captured)],
        "candidates": candidates,
        "dispatch": rows,
        "largest_capture_size": largest,
    }


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells]


def explain_text(report: dict) -> str:
    cfg = report["config"]
    lines = [
        f"config: mode {report['requested_mode']} -> resolved {report['resolved_mode']}, ruleset {report['ruleset']}",
        f"        capture_sizes {cfg['capture_sizes']}, max_num_reqs {cfg['max_num_reqs']}, decode_query_len {cfg['decode_query_len']}, "
        f"lora_cases {cfg['lora_cases']}, breakable {cfg['breakable']}",
        "",
        f"capture list ({len(report['capture_list'])} graphs, in capture order):",
    ]
    lines += [
        "  " + l
        for l in _table(
            ["#", "mode", "tokens", "reqs", "uniform", "max_q", "loras", "ubatches"],
            [[d["order"], d["cg_mode"], d["num_tokens"], _n(d["num_reqs"]), _n(d["uniform_token_count"]), _n(d["max_query_len"]), d["num_active_loras"], d["num_ubatches"]] for d in report["capture_list"]],
        )
    ]
    lines += ["", "candidate table (tokens -> priority tiers, tried in order):"]
    rows = []
    for c in report["candidates"]:
        span = str(c["tokens_from"]) if c["tokens_from"] == c["tokens_to"] else f"{c['tokens_from']}-{c['tokens_to']}"
        rows.append([span, c["lora"], " > ".join("{" + ", ".join(t) + "}" for t in c["tiers"])])
    lines += ["  " + l for l in _table(["tokens", "lora", "tiers"], rows)]
    lines += ["", f"dispatch (every batch up to {report['largest_capture_size']} tokens):"]
    lines += [
        "  " + l
        for l in _table(
            ["tokens", "batch", "reqs", "graph", "pad tok", "pad req", "waste"],
            [[r["num_tokens"], r["kind"], r["num_reqs"], r["graph"], r["pad_tokens"], r["pad_reqs"], f"{r['waste_pct']}%"] for r in report["dispatch"]],
        )
    ]
    return "\n".join(lines) + "\n"


def _n(v: Any) -> str:
    return "-" if v is None else str(v)


def write_plot(config: ManagerConfig, ruleset: str, path: str, max_tokens: int | None = None) -> None:
    """The spec's dispatch map of ``config`` (cgsim.report.plots), as .png or
    .svg by the file name.  Raises MissingMatplotlib without matplotlib and
    ValueError for another suffix."""
    from cgsim.report.plots import explain_picture, picture_format
    from cgsim.report.atomic import atomic_write_bytes

    atomic_write_bytes(path, explain_picture(config, ruleset, fmt=picture_format(path), max_tokens=max_tokens))
