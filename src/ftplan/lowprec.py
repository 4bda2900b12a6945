"""Low-precision training recipes (FP8, MXFP8, NVFP4): catalog, validation and memory terms.

A recipe is what a user selects in a real library today (``catalog/data/precisions.json``):
torchao float8 (``fp8-tensorwise``, ``fp8-rowwise``, ``fp8-rowwise-gw-hp``), Transformer Engine
(``fp8-te-delayed``, ``fp8-te-current``, ``mxfp8-te``, ``nvfp4-te``), torchao's MXFP8/NVFP4
training prototypes, and weight-only FP8 / NVFP4 bases for LoRA (``fp8-weight-only``,
``nvfp4-weight-only``). A job keeps its base precision (``bf16-mixed``: fp32 master weights, bf16
autocast) in ``Job.precision`` and names the recipe in ``Job.low_precision``; everything outside the
converted linears is unchanged.

What the recipes change in memory (per converted ``nn.Linear``; held against torchao 0.18 on CPU in
``tests/test_lowprec_memory.py``, Transformer Engine terms from its source):

* torchao float8 (all three recipes: one autograd function, ``matmul_with_hp_or_float8_args``)
  saves the high-precision input and the weight *parameter*; the FP8 casts are temporaries made
  again in backward. Full fine-tuning therefore keeps NO compute-dtype copy of converted weights
  (bf16 autocast keeps one: 2 bytes/parameter), and the same activations. With a frozen base
  (LoRA) the function still saves its input and computes the weight gradient, so every converted
  base linear keeps its input (inputs bf16 LoRA never saves) and backward runs 3 GEMMs, not 2.
* Transformer Engine saves the input quantized column-wise (FP8 transpose on Hopper/Ada) instead
  of the bf16 input, keeps the quantized weight row-wise and column-wise for dgrad, and (delayed
  scaling) an fp32 amax history of ``amax_history_len`` rows per FP8 tensor.
* weight-only bases: the frozen weights are stored quantized (FP8 + per-row fp32 scale; NVFP4 +
  E4M3 per 16 + fp32 per tensor, swizzled scales padded to 128 x 4). torchao's ``Float8Tensor``
  dequantizes above autograd, so a compute-dtype copy of every base weight whose input needs a
  gradient is saved for backward; ``NVFP4Tensor`` dequantizes below autograd and saves nothing
  extra.

Step time: ``ftplan.runtime`` times the converted linears (:func:`converted_counts`) at the
recipe's FP8/FP4 peak (:func:`low_precision_peak_tflops` x ``Recipe.efficiency_vs_bf16``), charges
the quantize kernels' traffic (:func:`quant_traffic_bytes`) and a weight-only base's dequantization
(:func:`weight_only_dequant`); this module only supplies those inputs.

Nothing is read at import time; the data file is parsed once, on first use.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from .errors import CatalogError, ConfigError, Problem
from .model import layer_linears

if TYPE_CHECKING:  # pragma: no cover
    from .catalog.gpus import GpuSpec
    from .model import LayerGroup, LinearSpec, ModelSpec

#: ``ftplan.job.Job`` / ``Layout`` (not imported: job.py imports this module)
Job = Any
Layout = Any

#: attention projections that read the (normed) decoder-layer input
READS_LAYER_INPUT = frozenset({"q_proj", "k_proj", "v_proj", "qkv_proj", "q_a_proj", "kv_a_proj_with_mqa"})



__all__ = [
    "QuantFormat",
    "Recipe",
    "recipes",
    "get_recipe",
    "resolve_precision",
    "apply_precision",
    "layer_linears",
    "READS_LAYER_INPUT",
    "converted_adapter_elems",
    "flop_split",
    "FlopSplit",
    "quant_traffic_bytes",
    "auto_precisions",
    "weight_only_dequant",
    "converted_counts",
    "low_precision_peak_tflops",
    "precision_names",
    "job_problems",
    "gpu_problem",
    "check_gpu",
    "converted_linears",
    "converted_weight_elems",
    "quantized_weight_bytes",
    "weight_copy_delta_bytes",
    "lora_extra_saved_bytes",
    "lora_first_layer_extra_bytes",
    "te_activation_delta_bytes",
    "amax_history_bytes",
    "gathered_layer_bytes",
    "fp8_transient_bytes",
]

_DATA = "precisions.json"


# ---------------------------------------------------------------------------------------------
# catalog
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantFormat:
    """Byte layout of one quantized tensor format."""

    name: str
    elem_bits: int
    scale: str  # "tensor", "row" or "block"
    scale_bytes: int
    block: int | None = None
    tensor_scale_bytes: int = 0
    swizzle_rows: int | None = None
    swizzle_cols: int | None = None

    def tensor_bytes(self, rows: int, cols: int, *, swizzled: bool = False) -> Fraction:
        """Bytes of a ``(rows, cols)`` tensor in this format: values, scales, per-tensor scale.
        ``cols`` is the dimension the blocks / rows run along (the GEMM's reduction dim)."""
        values = Fraction(rows * cols * self.elem_bits, 8)
        if self.scale == "tensor":
            scales = self.scale_bytes
        elif self.scale == "row":
            scales = rows * self.scale_bytes
        else:
            assert self.block
            n_rows, n_cols = rows, -(-cols // self.block)
            if swizzled and self.swizzle_rows and self.swizzle_cols:
                n_rows = -(-n_rows // self.swizzle_rows) * self.swizzle_rows
                n_cols = -(-n_cols // self.swizzle_cols) * self.swizzle_cols
            scales = n_rows * n_cols * self.scale_bytes
        return values + scales + self.tensor_scale_bytes


@dataclass(frozen=True)
class Recipe:
    name: str
    aliases: tuple[str, ...]
    display: str
    library: str
    min_version: str
    status: str  # "stable" or "prototype"
    api: str
    accelerate: dict | None
    kind: str  # "gemm" (low-precision GEMMs) or "weight_only" (quantized frozen base)
    base_precision: str
    methods: tuple[str, ...]
    input: QuantFormat | None
    weight: QuantFormat
    grad_output: QuantFormat | None
    low_precision_gemms: dict[str, bool]
    peak: str  # GPU catalog throughput the low-precision GEMMs run at: fp8, nvfp4 or bf16
    fsdp_float8_all_gather: bool
    min_dim_multiple: int
    nvidia_min_cc: str | None
    nvidia_cc: tuple[str, ...]
    nvidia_unverified_cc: tuple[str, ...]
    amd_arch: tuple[str, ...]
    transpose_copies_on: tuple[str, ...]
    amax_history_len: int
    fp8_meta_tensors: tuple[int, int]
    sources: tuple[str, ...]
    #: quantize kernels' memory passes per converted linear and step: tensor -> (reads of the
    #: high-precision tensor, writes of the quantized one)
    cast_traffic: dict[str, tuple[int, int]] = None  # type: ignore[assignment]
    auto: bool = False  # tried by ``precision=auto`` (recommend / compare)
    #: achieved fraction of the low-precision peak relative to what bf16 GEMMs achieve of theirs
    #: (calibrated against published runs where there are some; see the data file)
    efficiency_vs_bf16: float = 1.0

    @property
    def is_torchao_float8(self) -> bool:
        return self.library == "torchao" and self.kind == "gemm" and self.name.startswith("fp8-")

    @property
    def is_te(self) -> bool:
        return self.library == "transformer_engine"

    @property
    def skips_first_last_linear(self) -> bool:
        return bool(self.accelerate and self.accelerate.get("skips_first_last_linear"))


@dataclass(frozen=True)
class Unsupported:
    method: str
    precisions: tuple[str, ...]  # ("*",) = every recipe
    reason: str


@dataclass(frozen=True)
class _Catalog:
    recipes: dict[str, Recipe]
    unsupported: tuple[Unsupported, ...]
    as_of: str


def _cc(v: Any, where: str) -> str:
    s = str(v)
    try:
        float(s)
    except ValueError:
        raise CatalogError(f"{where}: compute capability {v!r} is not a number like '8.9'") from None
    return s


def parse_precisions(data: dict, where: str = _DATA) -> _Catalog:
    """Validate the precisions document (every recipe needs formats, GPUs and sources)."""
    fmts: dict[str, QuantFormat] = {}
    for name, f in (data.get("formats") or {}).items():
        if not f.get("source"):
            raise CatalogError(f"{where}: format {name!r} has no source")
        sw = f.get("swizzle") or {}
        try:
            fmts[name] = QuantFormat(name=name, elem_bits=int(f["elem_bits"]), scale=str(f["scale"]),
                                     scale_bytes=int(f["scale_bytes"]), block=f.get("block"),
                                     tensor_scale_bytes=int(f.get("tensor_scale_bytes", 0)),
                                     swizzle_rows=sw.get("rows"), swizzle_cols=sw.get("scale_cols"))
        except (KeyError, TypeError, ValueError) as e:
            raise CatalogError(f"{where}: format {name!r}: {e}") from None
        if fmts[name].scale not in ("tensor", "row", "block") or (fmts[name].scale == "block"
                                                                  and not fmts[name].block):
            raise CatalogError(f"{where}: format {name!r} needs scale tensor|row|block (with block)")
    out: dict[str, Recipe] = {}
    for r in data.get("recipes") or []:
        name = r.get("name")
        w = f"{where}: recipe {name!r}"
        if not name or not r.get("sources"):
            raise CatalogError(f"{w} needs a name and sources")

        def fmt(key: str, required: bool) -> QuantFormat | None:
            v = r.get(key)
            if v is None and not required:
                return None
            if v not in fmts:
                raise CatalogError(f"{w}: {key} format {v!r} is not in 'formats'")
            return fmts[v]

        gpu = r.get("gpu") or {}
        if not (gpu.get("nvidia_min_cc") or gpu.get("nvidia_cc")):
            raise CatalogError(f"{w} names no NVIDIA GPU it runs on")
        kind = r.get("kind")
        if kind not in ("gemm", "weight_only"):
            raise CatalogError(f"{w}: kind must be gemm or weight_only")
        meta = r.get("fp8_meta_tensors") or {"forward": 0, "backward": 0}
        out[name] = Recipe(
            name=name, aliases=tuple(r.get("aliases") or ()), display=r.get("display", name),
            library=r["library"], min_version=str(r.get("min_version", "")), status=r.get("status", "stable"),
            api=r.get("api", ""), accelerate=r.get("accelerate"), kind=kind,
            base_precision=r.get("base_precision", "bf16-mixed"), methods=tuple(r["methods"]),
            input=fmt("input", kind == "gemm"), weight=fmt("weight", True),  # type: ignore[arg-type]
            grad_output=fmt("grad_output", kind == "gemm"),
            low_precision_gemms=dict(r.get("low_precision_gemms") or {}), peak=r.get("peak", "fp8"),
            fsdp_float8_all_gather=bool(r.get("fsdp_float8_all_gather", False)),
            min_dim_multiple=int(r.get("min_dim_multiple", 16)),
            nvidia_min_cc=_cc(gpu["nvidia_min_cc"], w) if gpu.get("nvidia_min_cc") else None,
            nvidia_cc=tuple(_cc(c, w) for c in gpu.get("nvidia_cc", ())),
            nvidia_unverified_cc=tuple(_cc(c, w) for c in gpu.get("nvidia_unverified_cc", ())),
            amd_arch=tuple(gpu.get("amd_arch", ())),
            transpose_copies_on=tuple(r.get("transpose_copies_on", ())),
            amax_history_len=int(r.get("amax_history_len", 0)),
            fp8_meta_tensors=(int(meta.get("forward", 0)), int(meta.get("backward", 0))),
            sources=tuple(r["sources"]),
            cast_traffic={k: (int(v[0]), int(v[1])) for k, v in (r.get("cast_traffic") or {}).items()
                          if k in ("input", "grad_output", "weight")},
            auto=bool(r.get("auto", False)),
            efficiency_vs_bf16=float((r.get("efficiency_vs_bf16") or {}).get("value", 1.0)),
        )
    # efficiency_vs_bf16 {"same_as": NAME}: the (calibrated) value of another recipe
    for r in data.get("recipes") or []:
        same = (r.get("efficiency_vs_bf16") or {}).get("same_as")
        if same is not None:
            if same not in out or (next((x for x in data["recipes"] if x.get("name") == same), {})
                                   .get("efficiency_vs_bf16") or {}).get("same_as"):
                raise CatalogError(f"{where}: recipe {r['name']!r}: efficiency_vs_bf16 same_as {same!r} "
                                   "must name a recipe with its own value")
            out[r["name"]] = replace(out[r["name"]], efficiency_vs_bf16=out[same].efficiency_vs_bf16)
    uns = tuple(Unsupported(u["method"], tuple(u["precision"].split("|")), u["reason"])
                for u in data.get("unsupported") or [])
    return _Catalog(out, uns, str(data.get("as_of", "")))


@lru_cache(maxsize=1)
def _catalog() -> _Catalog:
    path = resources.files("ftplan.catalog") / "data" / _DATA
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CatalogError(f"cannot read bundled {_DATA}: {e}") from None
    return parse_precisions(data)


def recipes() -> dict[str, Recipe]:
    """Every low-precision recipe, by name."""
    return dict(_catalog().recipes)


def get_recipe(name: str | None) -> Recipe | None:
    if not name:
        return None
    return _catalog().recipes.get(name)


def precision_names() -> tuple[str, ...]:
    """Recipe names and aliases a user can pass as ``precision``."""
    names: list[str] = []
    for r in _catalog().recipes.values():
        names += [r.name, *r.aliases]
    return tuple(dict.fromkeys(names))


def resolve_precision(name: str, method: str = "full") -> Recipe | None:
    """The recipe a ``precision`` value names (``None`` when it names none: a base precision, or
    an unknown name that ``validate_job`` reports). An alias shared by several recipes (``nvfp4``:
    TE NVFP4 for full fine-tuning, an NVFP4 weight-only base for LoRA) resolves to the first one
    that supports ``method``."""
    cat = _catalog()
    if name in cat.recipes:
        return cat.recipes[name]
    hits = [r for r in cat.recipes.values() if name in r.aliases]
    for r in hits:
        if method in r.methods:
            return r
    return hits[0] if hits else None


def apply_precision(job: Job, name: str) -> Job:
    """``job`` with ``precision=name``: a base precision, or a recipe (``Job.__post_init__`` puts
    the recipe's base precision in ``precision`` and its name in ``low_precision``)."""
    return job.with_(precision=name, low_precision=None)


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------
def job_problems(model: ModelSpec, job: Job) -> list[Problem]:
    """Why ``job`` cannot run with its low-precision recipe (empty when it can); every problem is
    on the ``precision`` field."""
    r = get_recipe(job.low_precision)
    if r is None:
        return [Problem("precision", f"unknown low-precision recipe {job.low_precision!r}",
                        f"use one of {', '.join(precision_names())}")]
    out: list[Problem] = []
    for u in _catalog().unsupported:
        if u.method == job.method and ("*" in u.precisions or r.name in u.precisions):
            return [Problem("precision", f"`method={job.method}` with `precision={r.name}`: {u.reason}")]
    if job.method not in r.methods:
        out.append(Problem("precision", f"`precision={r.name}` supports `method={' / '.join(r.methods)}`, "
                                        f"not {job.method}"))
    if job.precision != r.base_precision:
        out.append(Problem("precision", f"`precision={r.name}` runs on {r.base_precision} (got base precision "
                                        f"{job.precision})"))
    if r.kind == "gemm" and not converted_linears(model, job):
        out.append(Problem("precision", f"`precision={r.name}`: no linear of {model.name} has dims divisible "
                                        f"by {r.min_dim_multiple}, nothing would run in low precision"))
    if r.kind == "weight_only":
        m = r.min_dim_multiple
        bad = sorted({lin.module for lin in _base_linears(model) if lin.in_features % m or lin.out_features % m})
        if bad:
            out.append(Problem("precision", f"`precision={r.name}`: {', '.join(bad)} of {model.name} have dims "
                                            f"not divisible by {m}, which {r.library} cannot quantize"))
    if model.is_hybrid:
        kind = "linear-attention" if model.has_gated_deltanet else "short-convolution"
        out.append(Problem("precision", f"`precision={r.name}` on a hybrid {kind} model ({model.name}) "
                                        "is not modelled yet", "use `precision=bf16-mixed`"))
        return out
    if job.method == "lora" and r.is_torchao_float8 and any(g.attention.is_mla for g in model.groups):
        out.append(Problem("precision", f"`method=lora` with `precision={r.name}` on MLA attention "
                                        f"({model.name}) is not modelled yet", "use `precision=bf16-mixed`"))
    return out


def _cc_tuple(cc: str) -> tuple[int, ...]:
    return tuple(int(x) for x in cc.split("."))


def gpu_problem(recipe: Recipe, gpu: GpuSpec) -> str | None:
    """Why ``recipe`` cannot run on ``gpu`` (``None`` when it can)."""
    supported: str
    if recipe.nvidia_cc:
        supported = "NVIDIA compute capability " + " / ".join(recipe.nvidia_cc)
    else:
        supported = f"NVIDIA compute capability >= {recipe.nvidia_min_cc}"
    if recipe.amd_arch:
        supported += " or AMD " + " / ".join(a.upper() for a in recipe.amd_arch)
    if gpu.vendor == "amd":
        if gpu.arch in recipe.amd_arch:
            return None
        return (f"{gpu.name} ({gpu.arch.upper()}) cannot run {recipe.name}: it needs {supported} "
                f"({recipe.library})")
    cc = gpu.compute_capability
    if cc in recipe.nvidia_unverified_cc:
        return (f"{recipe.name} on {gpu.name} (compute capability {cc}) is not verified to work "
                f"(see benchmarks/notes/low_precision_support.md); use `precision=fp8-tensorwise` there")
    ok = cc in recipe.nvidia_cc if recipe.nvidia_cc else (
        recipe.nvidia_min_cc is not None and _cc_tuple(cc) >= _cc_tuple(recipe.nvidia_min_cc))
    if ok and recipe.kind == "gemm":
        need = "fp4_tflops" if recipe.peak == "nvfp4" else "fp8_tflops"
        if getattr(gpu, need) is None:
            ok = False
        if recipe.peak == "nvfp4" and "nvfp4" not in gpu.fp4_formats:
            ok = False
    if ok:
        return None
    have = "no FP8 tensor cores" if gpu.fp8_tflops is None else (
        "no NVFP4 tensor cores" if recipe.peak == "nvfp4" and "nvfp4" not in gpu.fp4_formats
        else f"compute capability {cc}")
    return (f"{gpu.name} has {have}: {recipe.name} needs {supported} ({recipe.library}); "
            f"use `precision=bf16-mixed` on {gpu.name}")


def check_gpu(job: Job, gpu: GpuSpec) -> None:
    """Raise ``ConfigError`` when ``job``'s low-precision recipe cannot run on ``gpu``."""
    r = get_recipe(job.low_precision)
    if r is None:
        return
    msg = gpu_problem(r, gpu)
    if msg:
        raise ConfigError(msg, "pick a GPU that supports it or another `precision`", field="precision")


# ---------------------------------------------------------------------------------------------
# which linears run in low precision
# ---------------------------------------------------------------------------------------------
def _base_linears(model: ModelSpec) -> list[LinearSpec]:
    """The model's ``nn.Linear`` modules but the output layer (what ``TorchAoConfig`` quantizes)."""
    return [lin for lin in model.linears() if lin.is_module and lin.category != "lm_head"]


#: families whose attention registers a projection before the q/k/v one, so it is the model's
#: first ``nn.Linear`` in ``named_modules`` order (transformers 5 ``Phi3Attention.__init__`` creates
#: ``o_proj`` before ``qkv_proj``; every other family starts with q_proj / q_a_proj)
_FIRST_LINEAR = {"phi3": "o_proj"}


def _first_linear(model: ModelSpec) -> str:
    """Leaf name of the first ``nn.Linear`` in ``named_modules`` order (first layer, attention)."""
    return _FIRST_LINEAR.get(model.family) or layer_linears(model, model.groups[0])[0].module


def converted_linears(model: ModelSpec, job: Job) -> list[tuple[LinearSpec, int]]:
    """(linear kind, how many of them are converted) for the recipe's conversion rule: both dims
    divisible by ``min_dim_multiple``; accelerate's torchao path also skips the first and the last
    ``nn.Linear`` (first layer's first attention projection, ``lm_head``); Transformer Engine's
    ``convert_model`` converts the ``lm_head`` too. Weight-only recipes: every base linear."""
    return [(lin, n) for lin, n in zip(model.linears(), converted_counts(model, job)) if n > 0]


def converted_counts(model: ModelSpec, job: Job) -> tuple[int, ...]:
    """How many of each ``model.linears()`` entry the recipe converts (aligned with it; all zero
    without a recipe): the rule of :func:`converted_linears`."""
    r = get_recipe(job.low_precision)
    lins = model.linears()
    if r is None:
        return (0,) * len(lins)
    m = r.min_dim_multiple
    first = _first_linear(model) if r.skips_first_last_linear else None
    out = []
    for lin in lins:
        if not lin.is_module or lin.in_features % m or lin.out_features % m:
            out.append(0)
            continue
        if lin.category == "lm_head" and (r.skips_first_last_linear or r.kind == "weight_only"
                                          or getattr(job, "loss", "hf") != "hf"):
            out.append(0)  # (TRL's fused head / Liger read lm_head.weight directly: no module call to convert)
            continue
        n = lin.count
        if first is not None and lin.module == first and lin.category == "attention":
            n -= 1  # once: the first layer's (multi-group models list a kind once per group)
            first = None
        out.append(max(0, n))
    return tuple(out)


def converted_weight_elems(model: ModelSpec, job: Job) -> int:
    return sum(lin.in_features * lin.out_features * n for lin, n in converted_linears(model, job))


def converted_adapter_elems(model: ModelSpec, job: Job, targets: frozenset[str]) -> int:
    """LoRA A/B weights accelerate's torchao conversion also turns into ``Float8Linear`` (it runs
    after PEFT wrapped the model: every ``nn.Linear`` with dims divisible by 16); ``targets`` are
    the modules PEFT wraps (``ftplan.job.lora_targets``)."""
    r = get_recipe(job.low_precision)
    if r is None or not r.is_torchao_float8 or not job.uses_lora:
        return 0
    rank, m = job.lora.r, r.min_dim_multiple
    if rank % m:
        return 0
    n = 0
    for lin in model.linears():
        if lin.is_module and lin.module in targets:
            if lin.in_features % m == 0:
                n += rank * lin.in_features * lin.count
            if lin.out_features % m == 0:
                n += rank * lin.out_features * lin.count
    return n


# ---------------------------------------------------------------------------------------------
# memory terms
# ---------------------------------------------------------------------------------------------
def quantized_weight_bytes(model: ModelSpec, job: Job, rest_bytes: Fraction) -> Fraction:
    """Frozen base of a weight-only recipe: quantized linears (values + scales) plus every other
    parameter (embeddings, lm_head, norms, biases) at ``rest_bytes`` each (the base dtype)."""
    r = get_recipe(job.low_precision)
    assert r is not None and r.kind == "weight_only"
    swizzled = r.weight.name == "nvfp4"  # NVFP4WeightOnlyConfig stores tcgen05-swizzled scales
    q = Fraction(0)
    elems = 0
    for lin in _base_linears(model):
        q += r.weight.tensor_bytes(lin.out_features, lin.in_features, swizzled=swizzled) * lin.count
        elems += lin.in_features * lin.out_features * lin.count
    rest = model.params.total - elems
    return q + rest_bytes * rest


def _holds_weight_copies(job: Job, layout: Layout | None) -> bool:
    """Autocast keeps compute-dtype weight copies for backward (single GPU / DDP, no
    checkpointing); ZeRO/FSDP keep their own working copy (modelled by the layout code)."""
    if layout is not None and (layout.shards_params or layout.shards_optimizer):
        return False
    return not job.gradient_checkpointing


def weight_copy_delta_bytes(model: ModelSpec, job: Job, layout: Layout | None = None,
                            targets: frozenset[str] = frozenset()) -> int:
    """Change of the compute-dtype weight copies held for backward ("master_weights") against the
    base precision. torchao float8: converted weights (and converted LoRA adapters) keep none.
    Transformer Engine: the quantized workspace, row-wise + column-wise, replaces the bf16 copy.
    fp8-weight-only: a dequantized copy of every base weight whose input needs a gradient."""
    r = get_recipe(job.low_precision)
    if r is None:
        return 0
    c = 2  # the base precision's compute dtype (bf16)
    if r.is_torchao_float8:
        if job.method == "full":
            # (the base's copies of the full model; the layout code keeps only what is held)
            return -c * converted_weight_elems(model, job)
        if not _holds_weight_copies(job, layout):
            return 0
        return -c * converted_adapter_elems(model, job, targets)
    if r.is_te and job.method == "full":
        per = Fraction(0)
        for lin, n in converted_linears(model, job):
            w = r.weight.tensor_bytes(lin.out_features, lin.in_features)
            per += (2 * w - c * lin.in_features * lin.out_features) * n
        return math.ceil(per)
    if r.name == "fp8-weight-only" and not job.gradient_checkpointing:
        first = sum(lin.in_features * lin.out_features for lin in layer_linears(model, model.groups[0])
                    if lin.module in READS_LAYER_INPUT)
        return c * (sum(lin.in_features * lin.out_features * lin.count for lin in _base_linears(model)) - first)
    return 0


def amax_history_bytes(model: ModelSpec, job: Job) -> int:
    """Transformer Engine delayed scaling: per converted module an fp32 amax history of
    ``amax_history_len`` rows plus scale and scale_inv, for its forward (input, weight, output)
    and backward (grad_output, grad_input) FP8 tensors."""
    r = get_recipe(job.low_precision)
    if r is None or not r.amax_history_len:
        return 0
    fwd, bwd = r.fp8_meta_tensors
    n_modules = sum(n for _, n in converted_linears(model, job))
    return n_modules * 4 * ((r.amax_history_len + 2) * fwd + (r.amax_history_len + 2) * bwd)


def _mlp_down_input_width(g: LayerGroup, tp: int) -> list[int]:
    widths = []
    if g.mlp is not None:
        widths.append(g.mlp.intermediate_size // tp)
    if g.moe is not None and g.moe.shared is not None:
        widths.append(g.moe.shared.intermediate_size // tp)
    return widths


def _lora_input_parts(g: LayerGroup, model: ModelSpec, job: Job, *, t: int, compute: int, stream: int,
                      tp: int, backend: str) -> dict[str, int]:
    """Bytes per decoder layer, by the linear group whose input it is, that torchao's float8
    function saves for converted frozen base linears (bf16 LoRA saves none of them):
    ``attn_in`` (q/k/v or qkv: one compute-dtype tensor shared when the stream already is in the
    compute dtype, one cast per projection otherwise), ``o_in`` (the attention output: already
    saved by sdpa on CUDA; eager attention's contiguous copy, and on CPU the contiguous copy a fused
    qkv makes, are new), ``mlp_in`` (gate/up), ``down_in`` (the activation product)."""
    r = get_recipe(job.low_precision)
    if r is None or not r.is_torchao_float8 or job.method != "lora":
        return {}
    m = r.min_dim_multiple
    h = model.hidden_size
    a = g.attention
    if a.is_mla:
        raise ConfigError(f"`method=lora` with `precision={r.name}` on MLA attention ({model.name}) is not "
                          "modelled yet", "use `precision=bf16-mixed` for LoRA on this model", field="precision")

    def ok(lin_in: int, lin_out: int) -> bool:
        return lin_in % m == 0 and lin_out % m == 0

    q = a.num_heads * a.head_dim
    kv = a.num_kv_heads * a.head_dim
    per_copy = t * h * compute
    parts = {"attn_in": 0, "o_in": 0, "mlp_in": 0, "down_in": 0}
    qkv = [(h, q + 2 * kv)] if a.fused_qkv else [(h, q), (h, kv)] + ([] if a.k_eq_v else [(h, kv)])
    n_conv = sum(1 for i, o in qkv if ok(i, o))
    if n_conv:
        parts["attn_in"] = per_copy * (1 if stream == compute else n_conv)
    o_width = a.num_heads // tp * a.v_head_dim
    if ok(a.num_heads * a.v_head_dim, h) and (job.attn_impl == "eager" or (a.head_major_q and backend == "cpu")):
        parts["o_in"] = t * o_width * compute
    for i in _mlp_down_input_width(g, tp):
        fused = g.mlp is not None and g.mlp.fused_gate_up
        ups = [(h, 2 * i * tp)] if fused else [(h, i * tp), (h, i * tp)]
        n_up = sum(1 for a_, b_ in ups if ok(a_, b_))
        if n_up:
            parts["mlp_in"] += per_copy * (1 if stream == compute else n_up)
        if ok(i * tp, h):
            parts["down_in"] += t * i * compute
    return parts


def lora_extra_saved_bytes(g: LayerGroup, model: ModelSpec, job: Job, *, t: int, compute: int,
                           stream: int, tp: int = 1, backend: str = "cuda") -> int:
    """Per decoder layer of group ``g``: inputs of converted *frozen* base linears that torchao's
    float8 function saves although no weight gradient is needed (see :func:`_lora_input_parts`)."""
    return sum(_lora_input_parts(g, model, job, t=t, compute=compute, stream=stream, tp=tp,
                                 backend=backend).values())


def lora_first_layer_extra_bytes(model: ModelSpec, job: Job, *, t: int, compute: int, stream: int,
                                 backend: str = "cuda") -> int:
    """What the first layer saves less than :func:`lora_extra_saved_bytes` without checkpointing:
    its attention input needs no gradient (the embedding is frozen) and the float8 function (its
    weight frozen too) records nothing; its first ``nn.Linear`` stays unconverted (accelerate)."""
    parts = _lora_input_parts(model.groups[0], model, job, t=t, compute=compute, stream=stream, tp=1,
                              backend=backend)
    if not parts:
        return 0
    out = parts["attn_in"]
    if _first_linear(model) == "o_proj":
        out += parts["o_in"]
    return out


def te_activation_delta_bytes(g: LayerGroup, model: ModelSpec, job: Job, *, t: int, compute: int,
                              stream: int, tp: int = 1) -> int:
    """Per decoder layer, Transformer Engine (full fine-tuning): every converted linear saves its
    own column-wise quantized input instead of the compute-dtype input autocast saves (not
    CPU-checked: TE needs CUDA). The attention output stays saved by the attention kernel."""
    r = get_recipe(job.low_precision)
    if r is None or not r.is_te or job.method != "full":
        return 0
    h = model.hidden_size
    a = g.attention
    fmt = r.input
    assert fmt is not None

    def q(width: int) -> Fraction:
        return fmt.tensor_bytes(t, width)

    delta = Fraction(0)
    n_att = 1 if a.fused_qkv else (2 if a.k_eq_v else 3)
    delta += n_att * q(h) - t * h * compute * (1 if stream == compute else n_att)
    delta += q(a.num_heads // tp * a.v_head_dim)  # o_proj: its bf16 input is sdpa's output
    for i in _mlp_down_input_width(g, tp):
        n_up = 1 if (g.mlp is not None and g.mlp.fused_gate_up) else 2
        delta += n_up * q(h) - t * h * compute * (1 if stream == compute else n_up)
        delta += q(i) - t * i * compute
    return math.ceil(delta)


def gathered_layer_bytes(model: ModelSpec, job: Job, layer_params: int, compute: int) -> int:
    """What ZeRO-3/FSDP gathers for the largest layer: with FSDP2 float8 all-gather (torchao
    tensorwise, accelerate's default) the converted weights travel and stay unsharded in FP8
    (1 byte + one fp32 scale each), the rest in the compute dtype."""
    r = get_recipe(job.low_precision)
    if r is None or not r.fsdp_float8_all_gather:
        return layer_params * compute
    best = 0
    for g in model.groups:
        lins = layer_linears(model, g)
        conv = [lin for lin in lins if lin.in_features % r.min_dim_multiple == 0
                and lin.out_features % r.min_dim_multiple == 0]
        conv_elems = sum(lin.in_features * lin.out_features for lin in conv)
        total = sum(lin.params for lin in lins)
        if g.moe is not None:
            total += g.moe.num_experts * 3 * model.hidden_size * g.moe.expert_intermediate_size
        best = max(best, conv_elems + 4 * len(conv) + (total - conv_elems) * compute)
    return best


def fp8_transient_bytes(model: ModelSpec, job: Job) -> int:
    """Largest set of low-precision temporaries one converted linear holds at once in backward:
    the quantized grad_output (twice for rowwise: one per GEMM orientation), weight and input."""
    r = get_recipe(job.low_precision)
    if r is None or r.kind != "gemm" or r.input is None or r.grad_output is None:
        return 0
    t = job.micro_batch * job.seq_len
    twice = 2 if r.grad_output.scale != "tensor" else 1
    best = Fraction(0)
    for lin, _ in converted_linears(model, job):
        b = (twice * r.grad_output.tensor_bytes(t, lin.out_features)
             + r.weight.tensor_bytes(lin.out_features, lin.in_features)
             + r.input.tensor_bytes(t, lin.in_features))
        best = max(best, b)
    return math.ceil(best)


# ---------------------------------------------------------------------------------------------
# FLOPs: what runs in the low-precision GEMMs (for the runtime model)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlopSplit:
    """Hardware FLOPs per trained token, split by the tensor-core rate they run at."""

    low: float  # in the recipe's low-precision GEMMs (peak: ``Recipe.peak``)
    high: float  # everything else at the compute dtype's rate (attention, unconverted linears, adapters)
    #: of ``low + high``: weight-gradient GEMMs of frozen LoRA bases that torchao's float8 function
    #: computes although autograd discards them (bf16 LoRA does not run them)
    wasted: float

    @property
    def total(self) -> float:
        return self.low + self.high

    @property
    def low_share(self) -> float:
        return self.low / self.total if self.total else 0.0


def flop_split(model: ModelSpec, job: Job, hardware_flops: float) -> FlopSplit:
    """Split of the hardware FLOPs per token (``ftplan.runtime.flops_per_token(model, job).hardware``,
    passed in as ``hardware_flops``) for ``job``'s recipe.

    A converted linear runs fprop, dgrad and (full fine-tuning) wgrad in low precision, except the
    weight-gradient GEMM of ``rowwise_with_gw_hp``; under checkpointing its forward is recomputed
    in low precision too. torchao's float8 function also runs the wgrad GEMM of a frozen LoRA base
    (``wasted``). Attention (sdpa / flash in bf16), unconverted linears (accelerate leaves the first
    linear and ``lm_head``) and LoRA adapters stay in the compute dtype. Weight-only recipes run
    every GEMM in the compute dtype."""
    r = get_recipe(job.low_precision)
    if r is None or r.kind != "gemm":
        return FlopSplit(low=0.0, high=hardware_flops, wasted=0.0)
    conv_fwd = sum(2.0 * lin.in_features * lin.out_features * n * lin.token_fraction
                   for lin, n in converted_linears(model, job))
    wgrad_low = r.low_precision_gemms.get("wgrad", True)
    wasted = 0.0
    if job.method == "full":
        low = conv_fwd * (3.0 if wgrad_low else 2.0)
        high_extra = 0.0 if wgrad_low else conv_fwd
    else:  # frozen base: fprop + dgrad, plus the discarded wgrad GEMM
        wasted = conv_fwd
        low = conv_fwd * (3.0 if wgrad_low else 2.0)
        high_extra = 0.0 if wgrad_low else conv_fwd
    if job.gradient_checkpointing:
        low += conv_fwd
    # the base FLOP count has the converted linears' share already; move it, add the wasted GEMMs
    base_conv = conv_fwd * (3.0 if job.method == "full" else 2.0) + (conv_fwd if job.gradient_checkpointing else 0.0)
    high = hardware_flops - base_conv + high_extra
    return FlopSplit(low=low, high=high, wasted=wasted)


def quant_traffic_bytes(model: ModelSpec, job: Job) -> tuple[Fraction, Fraction]:
    """Memory traffic of the quantize (amax / cast / transpose) kernels, as
    (bytes per trained token, bytes per micro-batch): activations and gradients scale with tokens,
    the weight casts happen once per micro-batch (from the fp32 master in full fine-tuning, the
    frozen bf16 base in LoRA). Pass counts per recipe are in ``precisions.json`` (``cast_traffic``).
    This is what keeps a real FP8 step from being "GEMM time / 2": the runtime model charges it at
    HBM bandwidth."""
    r = get_recipe(job.low_precision)
    if r is None or r.kind != "gemm" or not r.cast_traffic or r.input is None or r.grad_output is None:
        return Fraction(0), Fraction(0)
    hp = 2  # compute-dtype activations and gradients
    w_hp = 4 if job.method == "full" else 2
    per_token = Fraction(0)
    per_mb = Fraction(0)
    rin, win = r.cast_traffic.get("input", (0, 0))
    rgo, wgo = r.cast_traffic.get("grad_output", (0, 0))
    rw, ww = r.cast_traffic.get("weight", (0, 0))
    for lin, n in converted_linears(model, job):
        i, o, tf = lin.in_features, lin.out_features, Fraction(lin.token_fraction)
        q_in = r.input.tensor_bytes(1024, i) / 1024  # per token (row), scales included
        q_go = r.grad_output.tensor_bytes(1024, o) / 1024
        per_token += n * tf * (rin * hp * i + win * q_in + rgo * hp * o + wgo * q_go)
        per_mb += n * (rw * w_hp * i * o + ww * r.weight.tensor_bytes(o, i))
    return per_token, per_mb


def auto_precisions(method: str, base: str = "bf16-mixed") -> tuple[str, ...]:
    """What ``precision=auto`` tries for ``method``: the base precision and the recipes marked
    ``auto`` in the data file that support the method (one FP8, one FP4)."""
    return (base,) + tuple(r.name for r in _catalog().recipes.values() if r.auto and method in r.methods)


def low_precision_peak_tflops(recipe: Recipe, gpu: GpuSpec) -> float | None:
    """The dense tensor-core peak the recipe's GEMMs run at on ``gpu`` (None: the GPU lacks it)."""
    if recipe.peak == "nvfp4":
        return gpu.fp4_tflops if "nvfp4" in gpu.fp4_formats else None
    if recipe.peak == "fp8":
        return gpu.fp8_tflops
    return gpu.bf16_tflops


def weight_only_dequant(model: ModelSpec, job: Job, recompute: float) -> tuple[float, float]:
    """(dequantization passes per micro-batch, bytes per pass) of a weight-only base (torchao
    ``Float8WeightOnlyConfig`` / ``NVFP4WeightOnlyConfig`` + PEFT), for the runtime's dequant term.

    torchao dequantizes the base to bf16 for every matmul that uses it: the forward, the recomputed
    share of it under checkpointing (``recompute``: the runtime's recomputed matmul share), and
    the input gradient: ``NVFP4Tensor`` dequantizes below autograd and keeps only the packed weight,
    so backward dequantizes again; ``Float8Tensor`` dequantizes above autograd and saved the bf16
    copy, except for the recomputed share. A pass reads the packed weights (values + scales) and
    writes bf16 (a lower bound: eager unpacking takes several elementwise kernels), like QLoRA's."""
    r = get_recipe(job.low_precision)
    if r is None or r.kind != "weight_only":
        return 0.0, 0.0
    passes = 1.0 + recompute + (1.0 if r.name == "nvfp4-weight-only" else recompute)
    elems = sum(lin.in_features * lin.out_features * lin.count for lin in _base_linears(model))
    swizzled = r.weight.name == "nvfp4"
    packed = sum(r.weight.tensor_bytes(lin.out_features, lin.in_features, swizzled=swizzled) * lin.count
                 for lin in _base_linears(model))
    return passes, float(packed + 2 * elems)
