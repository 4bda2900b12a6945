"""Generate ``benchmarks/notes/saved_tensors_inventory.md`` from real PyTorch measurements.

Usage (from the repository root, CPU only, a few minutes)::

    . .venv/bin/activate
    PYTHONPATH=src python benchmarks/notes/make_inventory.py            # writes the .md next to this file
    PYTHONPATH=src python benchmarks/notes/make_inventory.py --families llama mixtral --out /tmp/x.md

For every family of ``ftplan.measure.torchref.TINY_CONFIGS`` and every variant (fp32/bf16 weights, eager/sdpa
attention, activation checkpointing off/on, full fine-tuning / LoRA all-linear r=8 with dropout 0.1 and 0.0) it
runs the real forward (model's own loss included) under ``SavedTensorTracker`` at four (batch, seq_len) points,
groups the saved storages by decoder-layer component, and fits each component exactly as

    bytes(b, s) = A*b*s + B*b*s^2 + C*s + D        (separately per dtype of the saved tensors)

The fit is exact (integer arithmetic, checked for zero residual); the table reports A, B, C as element counts
times element size, with a symbolic reading in terms of the config (h = hidden, I = intermediate, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import re
import sys
import time
import warnings
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from ftplan.measure import torchref as tr  # noqa: E402

MAIN = (2, 32)
#: families without an sdpa path in transformers 5 (soft-capping: gemma2; attention sinks: gpt_oss)
EAGER_ONLY = {"gemma2", "gpt_oss"}
POINTS = [(2, 32), (3, 32), (4, 32), (2, 40), (3, 40), (2, 48), (3, 48)]  # b >= 2: see note on b=1
ELSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1, "uint8": 1}
SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int64": "i64", "int32": "i32", "bool": "bool"}


# ------------------------------------------------------------------------------------------------
# components
# ------------------------------------------------------------------------------------------------

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def component(rec: tr.SavedRecord) -> tuple[str, str]:
    """(scope, component) of a saved storage. scope is 'L<i>' or 'model'."""
    mod = rec.module
    layers = {int(m.group(1)) for s in rec.savers for m in [_LAYER_RE.search(s)] if m}
    if rec.op == "checkpoint_closure":
        return "model", "ckpt closure (layer kwargs: cos/sin, mask, position_ids)"
    m = _LAYER_RE.search(mod)
    if rec.param_copy:
        return (f"L{m.group(1)}" if m else "model"), "compute-dtype copies of parameters (autocast / PEFT casts)"
    is_rope = rec.op == "mul" and mod.endswith("self_attn") and len(rec.shape) == 4 and rec.shape[0] == 1
    if len(layers) > 1:
        # one storage saved by several layers: position embeddings (cos/sin) or the shared mask
        if rec.op == "scaled_dot_product_attention":
            return "model", "attention mask (shared by layers)"
        return "model", "rope cos/sin (shared by layers)"
    if is_rope and m is not None:
        return f"L{m.group(1)}", "rope cos/sin (this layer type only)"
    if m is None:
        if "embed_tokens" in mod:
            return "model", "embedding (input_ids)"
        if mod.endswith("model.norm") or mod == "model.norm" or mod.endswith(".norm") and "layers" not in mod:
            return "model", "final norm"
        if "lm_head" in mod:
            return "model", "lm_head input" if "lora" not in mod else "lora lm_head"
        if rec.op == "cross_entropy":
            return "model", "loss (cross_entropy: fp32 log_softmax, targets, total_weight)"
        if rec.op in ("tanh", "div", "__truediv__", "__mul__", "mul", "__rmul__", "float", "to"):
            return "model", f"logits post-processing ({rec.op})"
        if rec.op in ("embedding", "__mul__", "mul") and not mod:
            return "model", f"top-level {rec.op}"
        if "rotary" in mod:
            return "model", "rope cos/sin (shared by layers)"
        return "model", f"other top-level: {mod or '-'}:{rec.op}"
    scope = f"L{m.group(1)}"
    rest = mod[m.end():]
    parts = rest.split(".") if rest else []
    if "lora_dropout" in parts or any(p.startswith("lora_") for p in parts):
        kind = "dropout mask/out" if "lora_dropout" in parts else ("A in" if "lora_A" in parts else "B in")
        return scope, f"lora {kind}"
    if not parts:
        if rec.op == "checkpoint_input":
            return scope, "checkpoint input (hidden_states)"
        return scope, f"decoder-layer op ({rec.op})"
    head = parts[0]
    if head in ("input_layernorm",):
        return scope, "input norm"
    if head in ("post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
        return scope, head.replace("_layernorm", " norm").replace("_", "-")
    if head == "self_attn":
        sub = parts[1] if len(parts) > 1 else ""
        if sub in ("q_proj", "k_proj", "v_proj", "qkv_proj", "q_a_proj", "kv_a_proj_with_mqa"):
            return scope, "q/k/v proj input"
        if sub in ("q_b_proj", "kv_b_proj"):
            return scope, "MLA q_b/kv_b proj input"
        if sub in ("q_a_layernorm", "kv_a_layernorm"):
            return scope, "MLA q_a/kv_a norms"
        if sub in ("q_norm", "k_norm"):
            return scope, "q/k norm"
        if sub == "o_proj":
            return scope, "o_proj input"
        if sub == "rotary_emb":
            return scope, "rope"
        return scope, "attention core" if not sub else f"attention other ({sub})"
    if head in ("mlp", "block_sparse_moe", "feed_forward"):
        sub = parts[1] if len(parts) > 1 else ""
        if sub in ("gate", "router"):
            return scope, "router"
        if sub == "experts":
            return scope, "routed experts"
        if sub.startswith("shared_expert"):
            return scope, "shared experts"
        if rec.op in ("__add__", "add", "__iadd__") or sub == "":
            if rec.module_type.endswith(("MoE", "MoeBlock", "SparseMoeBlock")):
                return scope, "moe block glue"
        return scope, "mlp (dense)"
    return scope, f"other ({head})"


# ------------------------------------------------------------------------------------------------
# exact fit
# ------------------------------------------------------------------------------------------------


def _solve(rows: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction]:
    n = len(rows)
    m = [r[:] + [v] for r, v in zip(rows, rhs)]
    for c in range(n):
        piv = next(i for i in range(c, n) if m[i][c] != 0)
        m[c], m[piv] = m[piv], m[c]
        for i in range(n):
            if i != c and m[i][c] != 0:
                f = m[i][c] / m[c][c]
                m[i] = [a - f * b for a, b in zip(m[i], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


BASIS_LABELS = ["b*s", "b*s^2", "s", "s^2", "b", ""]


def _basis(b: int, s: int) -> list[Fraction]:
    return [Fraction(b * s), Fraction(b * s * s), Fraction(s), Fraction(s * s), Fraction(b), Fraction(1)]


def fit(values: dict[tuple[int, int], int]) -> tuple[list[Fraction], bool]:
    """Exact least squares of bytes on the basis over all POINTS (more points than unknowns), then an
    exactness check at every point: a component that is not of this form is reported, not hidden."""
    X = [_basis(*p) for p in POINTS]
    y = [Fraction(values.get(p, 0)) for p in POINTS]
    k = len(X[0])
    xtx = [[sum(X[r][i] * X[r][j] for r in range(len(X))) for j in range(k)] for i in range(k)]
    xty = [sum(X[r][i] * y[r] for r in range(len(X))) for i in range(k)]
    coef = _solve(xtx, xty)
    ok = all(sum(c * x for c, x in zip(coef, _basis(*p))) == values.get(p, 0) for p in POINTS)
    return coef, ok


# ------------------------------------------------------------------------------------------------
# symbolic reading
# ------------------------------------------------------------------------------------------------


def _mlp_width(cfg: dict) -> int:
    """The dense MLP's width as the model builds it (LFM2 derives it from ``block_ff_dim``)."""
    from ftplan.model import model_from_config

    widths = [g.mlp.intermediate_size for g in model_from_config(cfg).groups if g.mlp is not None]
    return widths[0] if widths else cfg.get("intermediate_size", 0)


def symbols(fam: str, cfg: dict, lora_r: int | None) -> dict[str, int]:
    h = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or h // nh
    out: dict[str, int] = {"h": h, "I": _mlp_width(cfg), "V": cfg["vocab_size"], "nh": nh, "kv": kv}
    if not out["I"]:  # no dense MLP (every layer MoE)
        del out["I"]
    if fam == "deepseek_v3":
        nope, rope, vhd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        out.update(
            {
                "q_lora": cfg["q_lora_rank"],
                "kv_lora": cfg["kv_lora_rank"],
                "rope": rope,
                "nh*(nope+rope)": nh * (nope + rope),
                "nh*vhd": nh * vhd,
                "kv_lora+rope": cfg["kv_lora_rank"] + rope,
                "nh*(nope+vhd)": nh * (nope + vhd),
            }
        )
    else:
        out.update({"nh*hd": nh * hd, "kv*hd": kv * hd, "hd": hd})
    if "moe_intermediate_size" in cfg or fam == "mixtral":
        from ftplan.model import model_from_config

        moe = next(g.moe for g in model_from_config(cfg).groups if g.moe is not None)
        k, im, ne = moe.top_k, moe.expert_intermediate_size, moe.num_experts
        out.update({"k*h": k * h, "k*Im": k * im, "E": ne, "k": k})
        if fam != "mixtral":
            out["Im"] = im
        if lora_r:
            out["k*r"] = k * lora_r
    if lora_r:
        out["r"] = lora_r
    return out


def decompose(n: int, syms: dict[str, int], max_terms: int = 3) -> dict[str, int] | None:
    """Smallest integer combination of symbols (+ a constant 0..16) equal to n, as {symbol: coef}
    (constant under key "1"); fewest terms first, then smallest constant, then smallest coefficients.
    Symbols with equal values are merged into one name 'a|b'."""
    if n == 0:
        return {}
    by_val: dict[int, list[str]] = defaultdict(list)
    for k, v in syms.items():
        if v > 1:
            by_val[v].append(k)
    items = sorted(((v, "|".join(ns)) for v, ns in by_val.items()), reverse=True)
    best: tuple | None = None
    for nt in range(0, max_terms + 1):
        for combo in itertools.combinations(items, nt):
            for coefs in itertools.product(range(1, 9), repeat=nt):
                rem = n - sum(c * v for c, (v, _) in zip(coefs, combo))
                if rem < 0 or rem > 16:
                    continue
                key = (nt + (rem > 0), rem, sum(coefs))
                if best is None or key < best[0]:
                    best = (key, combo, coefs, rem)
    if best is None:
        return None
    _, combo, coefs, rem = best
    out = {name: c for c, (_, name) in zip(coefs, combo)}
    if rem:
        out["1"] = rem
    return out


def fmt_terms(terms: dict[str, int]) -> str:
    if not terms:
        return "0"
    parts = []
    for name, c in sorted(terms.items(), key=lambda kv: (kv[0] == "1", kv[0])):
        if name == "1":
            parts.append(str(c))
        else:
            nm = f"({name})" if ("|" in name or "+" in name) and c != 1 else name
            parts.append(nm if c == 1 else f"{c}*{nm}")
    return " + ".join(parts)


COMPONENT_SYMS: list[tuple[str, tuple[str, ...]]] = [
    ("loss", ("V",)),
    ("logits", ("V",)),
    ("lm_head", ("h",)),
    ("embedding", ()),
    ("rope", ("hd", "rope")),
    ("compute-dtype copies", ()),
    ("ckpt closure", ("hd", "rope")),
    ("attention mask", ()),
    ("q/k norm", ("nh*hd", "kv*hd", "nh", "kv")),
    ("MLA q_a/kv_a", ("q_lora", "kv_lora", "kv_lora+rope")),
    ("MLA q_b/kv_b", ("q_lora", "kv_lora")),
    ("norm", ("h",)),
    ("q/k/v proj", ("h",)),
    ("checkpoint input", ("h",)),
    ("o_proj", ("nh*hd", "nh*vhd")),
    ("attention core", ("nh*hd", "kv*hd", "nh", "kv", "nh*(nope+rope)", "nh*vhd", "nh*(nope+vhd)", "kv_lora+rope")),
    ("shared experts", ("h", "Im")),
    ("mlp", ("h", "I")),
    ("router", ("h", "E", "k")),
    ("routed experts", ("k*h", "k*Im", "k", "E", "h")),
    ("moe block", ("h", "k*h")),
    ("lora", ("h", "I", "Im", "nh*hd", "kv*hd", "r", "nh*vhd", "q_lora", "kv_lora", "E", "k*h", "k*Im", "k*r")),
]


def syms_for(comp: str, syms: dict[str, int]) -> dict[str, int]:
    for key, names in COMPONENT_SYMS:
        if key in comp:
            return {n: syms[n] for n in names if n in syms}
    return {k: v for k, v in syms.items() if k != "V"}


class Formula:
    """Sum of per-record exact fits: per basis term and dtype, a symbolic element count."""

    def __init__(self) -> None:
        # (basis index, dtype) -> {symbol: coef}; raw bytes where no symbolic reading was found
        self.terms: dict[tuple[int, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.raw: dict[tuple[int, str], Fraction] = defaultdict(Fraction)

    def add(self, coef: list[Fraction], dtype: str, syms: dict[str, int]) -> None:
        es = ELSIZE.get(dtype, 1)
        sq_syms = {k: v for k, v in syms.items() if k in ("nh", "kv")}
        for i, c in enumerate(coef):
            if c == 0:
                continue
            elems = c / es
            if i == len(BASIS_LABELS) - 1 or elems.denominator != 1 or elems < 0:
                self.raw[(i, dtype)] += c
                continue
            dec = decompose(int(elems), sq_syms if i == 1 else ({} if i in (3, 4) else syms))
            if dec is None:
                self.raw[(i, dtype)] += c
                continue
            for k, v in dec.items():
                self.terms[(i, dtype)][k] += v

    def render(self) -> str:
        groups: dict[int, list[str]] = defaultdict(list)
        keys = sorted(set(self.terms) | set(self.raw), key=lambda k: (k[0], k[1]))
        for i, dt in keys:
            t = {k: v for k, v in self.terms.get((i, dt), {}).items() if v}
            raw = self.raw.get((i, dt), Fraction(0))
            if i == len(BASIS_LABELS) - 1:
                if raw:
                    groups[i].append(f"{raw}B")
                continue
            s = fmt_terms(t) if t else ""
            if raw:
                s = (s + " + " if s else "") + f"{raw}B"
            if s:
                groups[i].append(f"{SHORT.get(dt, dt)}:({s})" if s != "1" else f"{SHORT.get(dt, dt)}:1")
        out = []
        for i, lab in enumerate(BASIS_LABELS):
            if groups[i]:
                out.append(("const " + " + ".join(groups[i])) if not lab else f"{lab}·[{' + '.join(groups[i])}]")
        return " + ".join(out) if out else "0"


# ------------------------------------------------------------------------------------------------
# measurement
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Variant:
    fam: str
    dtype: str
    attn: str
    gc: bool
    mode: str  # "full" | "lora_d0.1" | "lora_d0.0"
    amp: bool = False  # fp32 weights + torch.autocast(bf16) around the forward (HF Trainer bf16=True)

    @property
    def label(self) -> str:
        dt = "fp32 weights + autocast(bf16)" if self.amp else self.dtype
        return f"{self.mode} {dt} {self.attn} {'ckpt' if self.gc else 'no-ckpt'}"


@dataclasses.dataclass
class Result:
    variant: Variant
    per_point: dict[tuple[int, int], list[tr.SavedRecord]]  # point -> records in save order
    totals: dict[tuple[int, int], int]
    error: str | None = None
    lora: tr.LoraApplied | None = None
    ckpt_calls: int = 0

    @property
    def records_main(self) -> list[tr.SavedRecord]:
        return self.per_point[MAIN]


def _all_linear(fam: str) -> str | list[str]:
    """PEFT's ``all-linear``, or the explicit list ftplan exports where it fails (llama4_text's router)."""
    from ftplan.job import LoraSpec, peft_target_modules
    from ftplan.model import model_from_config

    return peft_target_modules(model_from_config(tr.TINY_CONFIGS[fam]), LoraSpec(r=8, alpha=16))


def build(v: Variant) -> tuple[torch.nn.Module, tr.LoraApplied | None]:
    model = tr.build_model(tr.TINY_CONFIGS[v.fam], dtype=v.dtype, attn_implementation=v.attn)
    la = None
    if v.mode.startswith("lora"):
        d = float(v.mode.split("_d")[1])
        la = tr.apply_lora(model, r=8, alpha=16, dropout=d, target_modules=_all_linear(v.fam))
        model = la.model
    return model, la


def run_variant(v: Variant, model: torch.nn.Module, la: tr.LoraApplied | None) -> Result:
    per_point: dict = {}
    totals: dict = {}
    calls = 0
    for p in POINTS:
        m = tr.measure_step(model, batch=p[0], seq_len=p[1], gradient_checkpointing=v.gc, forward_only=True,
                            dtype="bf16" if v.amp else None)
        per_point[p] = m.records
        totals[p] = m.saved_activation_bytes
        if p == MAIN:
            calls = m.checkpoint_calls
    return Result(v, per_point, totals, lora=la, ckpt_calls=calls)


def _record_keys(recs: list[tr.SavedRecord]) -> list[tuple]:
    seen: dict[tuple, int] = defaultdict(int)
    out = []
    for r in recs:
        base = (r.module, r.op, r.producer, r.dtype, len(r.shape), r.param_copy)
        out.append(base + (seen[base],))
        seen[base] += 1
    return out


def fitted_components(res: Result, syms: dict[str, int]) -> tuple[dict[tuple[str, str], Formula], list[str]]:
    """Per (scope, component): the Formula summed over its records' exact fits."""
    per_key: dict[tuple, dict[tuple[int, int], int]] = defaultdict(dict)
    meta: dict[tuple, tr.SavedRecord] = {}
    for p, recs in res.per_point.items():
        for key, r in zip(_record_keys(recs), recs):
            per_key[key][p] = r.nbytes
            if p == MAIN or key not in meta:
                meta[key] = r
    out: dict[tuple[str, str], Formula] = defaultdict(Formula)
    problems: list[str] = []
    for key, vals in per_key.items():
        r = meta[key]
        sc, comp = component(r)
        coef, ok = fit(vals)
        if not ok:
            problems.append(f"{sc} {comp} {r.module}:{r.op} {r.dtype} values {vals}")
            # fall back to the b=2,s=32 bytes as a constant so totals stay right
            coef = [Fraction(0)] * (len(BASIS_LABELS) - 1) + [Fraction(vals.get(MAIN, 0))]
        out[(sc, comp)].add(coef, r.dtype, syms_for(comp, syms))
    return out, problems


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------


def _sort_scope(sc: str) -> tuple:
    return (0, int(sc[1:])) if sc.startswith("L") else (1, 0)


def component_table(res: Result, syms: dict[str, int]) -> list[str]:
    fc, problems = fitted_components(res, syms)
    by_comp: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    main_bytes: dict[tuple[str, str], int] = defaultdict(int)
    for r in res.records_main:
        main_bytes[component(r)] += r.nbytes
    order: list[str] = []
    for (sc, comp), formula in sorted(fc.items(), key=lambda kv: (_sort_scope(kv[0][0]), kv[0][1])):
        if comp not in order:
            order.append(comp)
        by_comp[comp][formula.render()].append(sc)
    el = 4 if res.variant.dtype == "fp32" else 2
    unit = MAIN[0] * MAIN[1] * syms["h"] * el
    lines = ["| scope | component | bytes @b=2,s=32 | ×(b·s·h·e) | exact formula (bytes) |", "|---|---|---:|---:|---|"]
    for comp in order:
        for rendered, scopes in by_comp[comp].items():
            scopes_sorted = sorted(scopes, key=_sort_scope)
            sc_label = scopes_sorted[0] if len(scopes_sorted) == 1 else "L" + ",".join(x[1:] for x in scopes_sorted)
            nb = main_bytes[(scopes_sorted[0], comp)]
            lines.append(f"| {sc_label} | {comp} | {nb} | {nb / unit:.4g} | `{rendered}` |")
    total = res.totals[MAIN]
    lines.append(f"| **all** | **total saved** | **{total}** | {total / unit:.4g} | |")
    if problems:
        lines += ["", "Not of the form A·bs+B·bs²+C·s+D·b+E (shown as their b=2,s=32 bytes):", ""]
        lines += [f"- {p}" for p in problems]
    return lines


def record_table(res: Result, layer: int, syms: dict[str, int]) -> list[str]:
    lines = ["| bytes | shape | dtype | module (layer-relative) | saved by op | producer | saves |", "|---:|---|---|---|---|---|---:|"]
    for r in res.records_main:
        m = _LAYER_RE.search(r.module)
        if m is None or int(m.group(1)) != layer:
            continue
        mod = r.module[m.end():] or "(layer)"
        lines.append(
            f"| {r.nbytes} | {tuple(r.shape)} | {SHORT.get(r.dtype, r.dtype)} | {mod} | {r.op} | {r.producer or '-'} | {r.n_saves} |"
        )
    return lines


def model_level_records(res: Result) -> list[str]:
    lines = ["| bytes | shape | dtype | module | saved by op | producer | saves |", "|---:|---|---|---|---|---|---:|"]
    for r in res.records_main:
        if _LAYER_RE.search(r.module) is not None and component(r)[0] != "model":
            continue
        lines.append(
            f"| {r.nbytes} | {tuple(r.shape)} | {SHORT.get(r.dtype, r.dtype)} | {r.module or '(top)'} | {r.op} | {r.producer or '-'} | {r.n_saves} |"
        )
    return lines


def interesting_layer(fam: str) -> int:
    if fam in ("qwen3_moe", "deepseek_v3"):
        return 1  # first MoE layer (layer 0 is dense)
    return 0


def profiler_section(families: list[str]) -> list[str]:
    lines = [
        "| family | variant | attn | ckpt | hook saved B | profiler live B | live − hook | explained as |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    runs = [("full fp32", "fp32", None, "eager"), ("full fp32", "fp32", None, "sdpa"),
            ("LoRA r8 d0 bf16", "bf16", 0.0, "sdpa")]
    for fam in families:
        for label, dtype, lora_d, attn in runs:
            if fam in EAGER_ONLY and attn == "sdpa":
                attn = "eager" if lora_d is not None else None
            if attn is None:
                continue
            model = tr.build_model(tr.TINY_CONFIGS[fam], dtype=dtype, attn_implementation=attn)
            if lora_d is not None:
                model = tr.apply_lora(model, r=8, alpha=16, dropout=lora_d, target_modules=_all_linear(fam)).model
            for gc in (False, True):
                lb = tr.live_bytes_after_forward(model, batch=MAIN[0], seq_len=MAIN[1], gradient_checkpointing=gc)
                ex = lb.explain()
                parts = []
                if ex.get("loss"):
                    parts.append(f"loss {ex['loss']}")
                if ex.get("input_ids"):
                    parts.append(f"input_ids {ex['input_ids']} (not saved: frozen embedding)")
                if ex.get("graph_leaf"):
                    parts.append(f"graph leaf {ex['graph_leaf']} (the embedding output enable_input_require_grads "
                                 "marks, held by AccumulateGrad)")
                if ex.get("wrapped_number_scalars_8B"):
                    parts.append(f"{ex['wrapped_number_scalars_8B'] // 8}×8 B scalars")
                if ex.get("checkpoint_rng_state"):
                    parts.append(f"{ex['checkpoint_rng_state'] // 5056}×5056 B RNG state")
                if ex.get("other"):
                    parts.append(f"UNEXPLAINED {ex['other']}")
                if lb.saved_not_live:
                    parts.append(f"hook-only {sum(lb.saved_not_live.values())}")
                lines.append(
                    f"| {fam} | {label} | {attn} | {'on' if gc else 'off'} | {lb.hook_saved_bytes} | {lb.live_bytes} | "
                    f"{lb.live_bytes - lb.hook_saved_bytes} | {', '.join(parts)} |"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", nargs="*", default=sorted(tr.TINY_CONFIGS))
    ap.add_argument("--out", default=str(Path(__file__).with_name("saved_tensors_inventory.md")))
    ap.add_argument("--quick", action="store_true", help="fp32 only, no LoRA (debugging)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    t0 = time.time()

    doc: list[str] = []
    body: list[str] = []
    for fam in args.families:
        cfg = tr.TINY_CONFIGS[fam]
        print(f"[{time.time() - t0:6.1f}s] {fam}", file=sys.stderr)
        body += [f"## {fam}", ""]
        body.append("Config: " + ", ".join(f"`{k}={v}`" for k, v in cfg.items() if k != "model_type") + ".")
        body.append("")
        body.append("Symbols used in formulas: " + ", ".join(f"{k}={v}" for k, v in symbols(fam, cfg, 8).items())
                    + "; `b*s` terms are per token, `b*s^2` per (batch × seq²), `s` per position (shared by the batch).")
        body.append("")
        attns = ["eager"] if fam in EAGER_ONLY else ["eager", "sdpa"]
        dtypes = ["fp32"] if args.quick else ["fp32", "bf16"]
        modes = ["full"] if args.quick else ["full", "lora_d0.1", "lora_d0.0"]
        for mode in modes:
            for dtype in dtypes:
                for attn in attns:
                    if mode != "full" and attn == "eager" and fam not in EAGER_ONLY:
                        continue  # LoRA tables with sdpa only (the attention core is the same as full FT)
                    v0 = Variant(fam, dtype, attn, False, mode)
                    try:
                        model, la = build(v0)
                    except Exception as e:  # noqa: BLE001 - report what PEFT/transformers say
                        body += [f"### {v0.label.replace(' no-ckpt', '')}", "", f"**Not runnable:** `{type(e).__name__}: {e}`", ""]
                        continue
                    for gc in (False, True):
                        v = Variant(fam, dtype, attn, gc, mode)
                        res = run_variant(v, model, la)
                        syms = symbols(fam, cfg, 8 if la else None)
                        body += [f"### {v.label}", ""]
                        if la is not None and not gc:
                            body.append(
                                f"PEFT targeted modules: `{', '.join(la.targeted_suffixes) or '-'}`; target parameters: "
                                f"`{', '.join(sorted({p.split('.layers.')[-1].split('.', 1)[-1] for p in la.targeted_parameters})) or '-'}`; "
                                f"untargeted nn.Linear: `{', '.join(la.untargeted_linear)}`; LoRA params {la.lora_params}."
                            )
                            body.append("")
                        if gc:
                            body.append(f"Checkpointed calls: {res.ckpt_calls}.")
                            body.append("")
                        body += component_table(res, syms)
                        body.append("")
                        if not gc and mode == "full":
                            L = interesting_layer(fam)
                            body += [f"<details><summary>layer {L} saved storages (b=2, s=32)</summary>", ""]
                            body += record_table(res, L, syms)
                            body += ["", "model-level storages:", ""]
                            body += model_level_records(res)
                            body += ["", "</details>", ""]
        # mixed precision: fp32 weights + autocast(bf16), full fine-tuning
        if not args.quick:
            attn = attns[-1]
            v0 = Variant(fam, "fp32", attn, False, "full", amp=True)
            model, la = build(v0)
            for gc in (False, True):
                v = Variant(fam, "fp32", attn, gc, "full", amp=True)
                res = run_variant(v, model, la)
                body += [f"### {v.label}", ""]
                body += component_table(res, symbols(fam, cfg, None))
                body.append("")
    print(f"[{time.time() - t0:6.1f}s] profiler cross-check", file=sys.stderr)
    prof = profiler_section(args.families)

    doc += HEADER.format(date=datetime.date.today().isoformat(), torch=torch.__version__,
                         points=", ".join(f"({b},{q})" for b, q in POINTS),
                         tf=__import__("transformers").__version__, peft=__import__("peft").__version__).splitlines()
    doc += ["", "## Hook vs allocator (profiler) cross-check, b=2, s=32", ""]
    doc += PROFILER_NOTE.splitlines()
    doc += [""] + prof + [""]
    doc += body
    Path(args.out).write_text("\n".join(doc) + "\n")
    print(f"[{time.time() - t0:6.1f}s] wrote {args.out}", file=sys.stderr)
    return 0


HEADER = """# Saved-tensor inventory of real HF training forwards (CPU, tiny random models)

Generated by `benchmarks/notes/make_inventory.py` on {date} with torch {torch}, transformers {tf}, peft {peft},
using `ftplan.measure.torchref` (do not edit by hand; re-run the script).

**What is counted.** Every storage autograd keeps for the backward pass at the end of the forward (the model's
own loss included, outputs other than `loss` dropped, as HF Trainer does), each storage once at its full size,
parameters/buffers and views of them excluded, only storages still referenced by the graph. Under (HF default,
non-reentrant) activation checkpointing: each checkpointed layer's positional input (`hidden_states`, seen by
the outer hook via `_CheckpointFrame.save_inputs`) and the tensors captured by the recompute closure
(`position_embeddings` cos/sin, `attention_mask`, `position_ids`), counted once. Not counted: the checkpoint's
CPU RNG state (5056 B host memory per checkpointed layer), 8-byte wrapped-number scalars (autograd saves them
without calling hooks), the 4-byte loss itself — see the cross-check table.

**How to read the tables.** Components are grouped per decoder layer (`L0`, `L1`, … ; identical layers are
merged, e.g. `L0,1`) and at model level. `bytes @b=2,s=32` is the measured size; `×(b·s·h·e)` divides it by
b·s·hidden·(element size of the model dtype). The exact formula is, per saved storage, an exact integer
fit over (b, s) ∈ {points} of `A·b·s + B·b·s² + C·s + D·s² + E·b + F` (checked to reproduce every point;
failures would be listed under the table), summed per component and split by the dtype of the saved
tensors: `b*s·[f32:(2*h + 1) + bf16:(h)]` means per token 4·(2h+1) bytes of fp32 plus 2·h bytes of bf16;
`b*s^2·[f32:(nh)]` means 4·nh bytes per batch row and query×key pair.
Symbol readings are found automatically (smallest integer combination; when two symbols have the same value
they are shown as `a|b`), so read them together with the record listings. Sliding windows (16) are smaller
than every s used, so windowed layers are measured where the window matters.

## Main findings (read this first)

1. **HF v5 checkpointing is non-reentrant** (`activation_checkpointing_enable()` default
   `{{"use_reentrant": False}}`; `gradient_checkpointing_enable` is a deprecated alias that forwards to it).
   Per checkpointed decoder layer exactly its input `hidden_states` survives (b·s·h, model dtype), plus once
   per model the tensors captured by the layers' keyword arguments: cos and sin (`(1, s, rope_dim)` each,
   model dtype; gemma3 has a second pair for its full-attention layers), `position_ids` (int64, s) and any
   materialised mask (eager: `(b,1,s,s)` in the model dtype per distinct layer type; sdpa: only for sliding
   windows, as a `(1,1,s,s)` bool). Everything after the last layer is not checkpointed: final norm,
   lm_head input, fp32 log-softmax and targets stay. HF also calls `enable_input_require_grads()`.
2. **Loss / logits.** `ForCausalLMLoss` upcasts the logits (`.float()`) and calls `cross_entropy`; saved are
   the fp32 `log_softmax` output (b·s·V·4 bytes in every model dtype), the int64 shifted targets (b·s·8) and
   a 4-byte `total_weight`. The logits (b·s·V, model dtype) and their fp32 copy are NOT saved: they are
   transient (peak) memory, freed once the loss exists and the outputs are dropped. Gemma2's final
   soft-capping (`tanh(logits/30)*30`) additionally saves the tanh output (b·s·V, model dtype). Edge case:
   with b = 1, `labels[..., 1:].contiguous()` is already contiguous, so the saved targets are the padded
   `(1, s+1)` labels (8·(s+1) bytes) — the fits use b ≥ 2.
3. **RMSNorm** (llama style: upcast to fp32, `x*rsqrt(mean(x²)+eps)`, cast back, `weight*x`) saves per token
   the fp32 input (h; a fresh fp32 copy in bf16 models), the fp32 rsqrt (1) and the normalised x in the model
   dtype (h): fp32 models `4·(2h+1)`, bf16 models `4·(h+1) + 2·h` bytes/token. Gemma norms compute entirely
   in fp32 (`x.float()`, `* (1 + weight.float())`, cast at the end), so they keep `4·(2h+1)` bytes/token even
   in bf16 models, plus the fp32 `1 + weight` (h elements, constant) per call. With frozen norm weights
   (LoRA) the normalised x is not saved: `4·(h+1)` only. Per-head q/k norms (qwen3, gemma3) cost
   `(nh+kv)·(2·hd+1)` fp32 elements/token (`(nh+kv)·(hd+1)` with frozen weights).
4. **Linear layers save their input once per storage** (q/k/v share the normed input, gate/up share
   theirs; o_proj's input is sdpa's saved `out`; down_proj's input is `act(g)*u`). Dense MLP (SwiGLU/GeGLU):
   `h + 4·I` per token (gate/up input, gate out, act out, up out, product). phi3's fused `gate_up_proj`
   costs the same 4·I: its 2·I output is kept whole because views of it are saved.
5. **Eager attention** saves q and k after RoPE (k after `repeat_kv`, i.e. nh heads), v after `repeat_kv`,
   the fp32 softmax output (b·nh·s²·4) and, in bf16 models, also its bf16 cast (b·nh·s²·2) as the matmul
   operand. No pre-softmax scores, no dropout mask at attention_dropout = 0, sliding windows do not shrink
   anything. Gemma2 soft-capping adds the tanh output (b·nh·s², model dtype). RoPE itself saves only the
   shared cos/sin.
6. **SDPA on CPU** runs the CPU flash kernel (no s² matrix): saved are q, k, v, out and an fp32 logsumexp
   (b·nh·s·4). k/v keep kv heads (`enable_gqa`) only when no mask is passed; with a sliding-window mask HF
   repeats k/v to nh heads and every sliding layer's sdpa saves its own float copy of the mask (b·s² in the
   model dtype). DeepSeek-V3 MLA (qk head dim ≠ v head dim) falls back to the *math* kernel on CPU, which
   saves the s² softmax like eager. Gemma2 has no sdpa path in transformers 5 (soft-capping). CUDA kernels
   differ (flash / mem-efficient save q, k, v, out, an lse with padded length, RNG seed/offset).
   **One kv head (MQA) or no repetition** (kv heads = heads; also per rank under TP): `repeat_kv`'s
   `expand().reshape()` is then a *view* (0 stride over the heads) or the input itself, and a saved view
   keeps only the storage it views: sdpa (after `repeat_kv`, any batch) saves it as is; eager's
   `torch.matmul` folds (b, heads) with `reshape`, a view at b = 1, a copy of every head at b > 1. The
   storage is k after RoPE (kv heads) and v's projection output (phi3: the whole fused qkv output, also
   under sdpa's native GQA); where k or v is not in the compute dtype (HF autocast: RoPE promotes k to
   the fp32 residual stream of full fine-tuning; PEFT's kbit recipe: fp32 4-bit outputs), autocast's
   cast is a dense copy of every head. `memory._kv_saved`, `tests/test_mqa.py`.
7. **MoE (transformers v5 fused experts, default `experts_implementation="grouped_mm"`, also on CPU)** saves
   per MoE layer, with S = b·s·k (k = top-k): router input (h, shared with the experts' input if no other
   saver), router probabilities (E), routing weights/normaliser (k + 1), top-k indices (int64 k); in the
   experts the permuted token copy (S·h), the whole gate_up output (S·2·Im; silu and the `up` multiply keep
   views of it), act (S·Im), act·up (S·Im), per-row weights (S), the down output (S·h), three int64 index
   vectors (3·S) and the int32 group offsets (E·4). No capacity padding: exactly proportional to b·s·k.
   DeepSeek's shared experts are a dense MLP with I = Im·n_shared (4·Im per token).
8. **LoRA (peft 0.21).** `all-linear` targets every `nn.Linear` except `lm_head`. On v5 MoE models
   (mixtral, qwen3_moe, deepseek_v3) PEFT *rewrites* `all-linear`: expert projections and the router become
   `target_parameters` (`gate_up_proj` at rank 2r and alpha 2α, `down_proj` at rank r, router `gate.weight`
   at rank r) and `gate_proj/up_proj/down_proj` leave `target_modules`, so dense MLP layers (qwen3_moe
   layer 0, deepseek layer 0) and DeepSeek's shared experts end up **untargeted**. `ParamWrapper` refuses
   `lora_dropout != 0` (ValueError), and each forward materialises `W + ΔW` for *all* experts, which
   grouped_mm saves → activations ≈ the experts' weight bytes per MoE layer.
9. **LoRA adapters are fp32 on bf16 models** (`get_peft_model(autocast_adapter_dtype=True)` default) and each
   LoRA layer casts its input to fp32 before `lora_A`: every wrapped linear saves its own fp32 copy of its
   input (q, k, v no longer share), plus the fp32 `lora_B` input (r). LoRA dropout p > 0 adds, per wrapped
   linear, the dropout noise (CPU: a scaled float tensor in the input dtype; CUDA's `native_dropout` keeps a
   1-byte bool mask instead) and the dropped copy; p = 0 uses `nn.Identity`. Without checkpointing the
   embedding output does not require grad, so layer 0 saves less (frozen ops on grad-free inputs save
   nothing); with checkpointing HF's `enable_input_require_grads()` changes that.
10. **Mixed precision (fp32 weights + `torch.autocast(bf16)`, HF Trainer `bf16=True`)**: each linear saves a
   bf16 copy of its weight (reported as `autocast weight copies`, lm_head's V·h included) and its own bf16
   copy of its input (q, k, v each), norms and the loss stay fp32.
11. **gpt_oss** (attention sinks, no sdpa path: eager only): the scores are joined with the per-head sink
   logits (`torch.cat` promotes to the sinks' dtype: fp32 under autocast with fp32 weights, bf16 on a bf16
   base), the row max keeps its int64 indices, the softmax runs in that dtype over s + 1 columns and is cast
   for the value matmul only when wider. Its biased `grouped_mm` experts save the gate_up output, the
   clamped gate, its sigmoid, up + 1 and the product of the clamped SwiGLU (plus, when the experts train,
   the gathered rows, down's input and the sorted expert ids of the bias gathers); the router keeps its
   top-k ids and the softmax of the k chosen logits. Its norms multiply in fp32 (`(weight * x).to(dtype)`).
   Eager builds the sliding and the full mask every forward, even when the window covers the row.
"""

PROFILER_NOTE = """`profiler live` = bytes allocated during the forward and still allocated at its end, replayed by address from
`torch.profiler.profile(activities=[CPU], profile_memory=True)` (`live_bytes_after_forward`); `hook saved` = the
hook measurement of the *same* forward (same addresses, so every block is matched). The differences are fully
explained: the 4-byte loss (an output, not saved), 8-byte float64 "wrapped number" scalars that autograd saves
without calling hooks (e.g. `attn_weights * scaling` in eager attention, soft-capping divisions, LoRA's
`* scaling`), with checkpointing one 5056-byte CPU RNG-state tensor per checkpointed layer (host memory even
on GPU), with LoRA the `input_ids` themselves (created inside the profiled region and held by the caller;
with a frozen embedding nothing saves them), and with LoRA under checkpointing, where the model scales the
embedding output before the first layer (Granite's `embedding_multiplier`), that output: the leaf
`enable_input_require_grads` marks, held by the graph's `AccumulateGrad` (planned:
`memory._embedding_leaf_bytes`). The hook count includes the tensors the recompute closures hold through
dict-like containers (Gemma 4's `shared_kv_states`, a `KVSharingDict`, read when the forward ends)."""


if __name__ == "__main__":
    raise SystemExit(main())
