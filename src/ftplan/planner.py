"""Search offers x layouts x batch shapes for plans that fit, rank them, explain the rest.

``recommend(model, job, offers, ...) -> PlanSet``: every feasible plan (one per offer and
layout: the fastest micro-batch / checkpointing choice, which is also the cheapest for that
offer and layout), ranked by cost or time under a deadline and a budget, with the cost-time
Pareto frontier flagged and, per GPU type without a plan, the reason in numbers.

``fit(model, job, gpu) -> FitResult``: the longest sequence and largest micro-batch that fit
one GPU, and the fewest GPUs each strategy needs.

Performance: memory does not depend on the GPU (only on its vendor's context size), so memory
breakdowns are cached per (vendor, layout, job) and shared by every GPU type and offer; runtime
is cached per (GPU type, inter-node bandwidth, layout, job). Micro-batch search stops at the
first size that does not fit (memory grows with it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .cost import Cost, estimate_cost
from .errors import ConfigError, FtplanError
from .job import Job, Layout, validate_job
from .memory import MemoryBreakdown, estimate_memory
from .model import ModelSpec
from .runtime import RuntimeEstimate, compute_dtype, estimate_runtime
from .units import GB

__all__ = ["Plan", "Infeasible", "PlanSet", "SearchStats", "FitResult", "recommend", "fit", "platform_job",
           "DEFAULT_MAX_GPUS", "OBJECTIVES"]

OBJECTIVES = ("cost", "time")
#: the search goes up to this many GPUs when --max-gpus is not given (said in PlanSet.notes)
DEFAULT_MAX_GPUS = 64
_DP_STRATEGIES = ("ddp", "zero2", "zero3")  # fsdp FULL_SHARD = zero3 in memory and runtime
_MAX_MICRO_BATCH = 1 << 16


@dataclass(frozen=True)
class Plan:
    offer: Any
    gpu: Any
    layout: Layout
    job: Job
    memory: MemoryBreakdown
    runtime: RuntimeEstimate
    cost: Cost
    cheapest: bool = False
    fastest: bool = False
    pareto: bool = False
    notes: tuple[str, ...] = ()

    @property
    def hours(self) -> float:
        """Wall-clock hours: training + start-up."""
        return self.runtime.total_hours or 0.0

    @property
    def usd(self) -> float:
        return self.cost.usd

    @property
    def strategy_label(self) -> str:
        lo = self.layout
        s = "zero3/fsdp" if lo.strategy in ("zero3", "fsdp") else lo.strategy
        if lo.tp > 1:
            s += f"+tp{lo.tp}"
        if lo.pp > 1:
            s += f"+pp{lo.pp}"
        if lo.offload_params:
            s += "+offload(opt,params)"
        elif lo.offload_optimizer:
            s += "+offload(opt)"
        return s


@dataclass(frozen=True)
class Infeasible:
    gpu: str
    reason: str
    needed_bytes: int | None = None
    available_bytes: int | None = None
    hint: str | None = None

    def message(self) -> str:
        return self.reason + (f" — {self.hint}" if self.hint else "")


@dataclass(frozen=True)
class SearchStats:
    offers: int
    gpu_types: int
    layouts: int
    memory_evals: int
    runtime_evals: int
    candidates: int
    seconds: float
    max_gpus: int

    @property
    def candidates_per_s(self) -> float:
        return self.candidates / self.seconds if self.seconds > 0 else float("inf")


@dataclass(frozen=True)
class PlanSet:
    objective: str
    plans: tuple[Plan, ...]  # ranked by the objective, constraints applied
    infeasible: tuple[Infeasible, ...]
    stats: SearchStats
    notes: tuple[str, ...] = ()

    @property
    def best(self) -> Plan | None:
        return self.plans[0] if self.plans else None

    @property
    def cheapest(self) -> Plan | None:
        return next((p for p in self.plans if p.cheapest), None)

    @property
    def fastest(self) -> Plan | None:
        return next((p for p in self.plans if p.fastest), None)

    def pareto(self) -> tuple[Plan, ...]:
        return tuple(sorted((p for p in self.plans if p.pareto), key=lambda p: (p.usd, p.hours)))

    def top(self, n: int) -> tuple[Plan, ...]:
        return self.plans[: max(0, n)]

    def best_per_gpu(self) -> tuple[Plan, ...]:
        """The best plan of each GPU type, in objective order (the performance-per-dollar table)."""
        seen: set[str] = set()
        out = []
        for p in self.plans:
            if p.gpu.name not in seen:
                seen.add(p.gpu.name)
                out.append(p)
        return tuple(out)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _pow2_upto(n: int) -> list[int]:
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


class _Memo:
    """Memory breakdowns per (vendor, layout, job), shared by all GPU types; counts evaluations."""

    def __init__(self, model: ModelSpec) -> None:
        self.model = model
        self.cache: dict[tuple, MemoryBreakdown | None] = {}
        self.evals = 0

    def get(self, vendor: str, layout: Layout, job: Job) -> MemoryBreakdown | None:
        key = (vendor, layout, job)
        if key in self.cache:
            return self.cache[key]
        self.evals += 1
        try:
            mem = estimate_memory(self.model, job, layout, gpu_vendor=vendor)
        except ConfigError:
            mem = None  # layout not valid for this model (e.g. tp does not divide heads)
        self.cache[key] = mem
        return mem


def platform_job(job: Job, gpu: Any) -> tuple[Job | None, list[str], str | None]:
    """(job adapted to the GPU, notes, reason it cannot run there)."""
    notes: list[str] = []
    if job.method == "qlora" and not getattr(gpu, "supports_bitsandbytes", True):
        return None, notes, (f"qlora needs bitsandbytes 4-bit kernels, not available on {gpu.name} "
                             f"({gpu.vendor} {gpu.arch})")
    try:
        peak = gpu.peak_tflops(compute_dtype(job))
    except FtplanError:
        peak = None
    if not peak:
        return None, notes, f"{gpu.name} has no {compute_dtype(job)} tensor throughput"
    if job.attn_impl == "flash" and not getattr(gpu, "supports_flash_attention", True):
        job = job.with_(attn_impl="sdpa")
        notes.append(f"flash attention not available on {gpu.name}: sdpa assumed")
    return job, notes, None


_platform_job = platform_job  # the name before it was public


def _has_network(offer: Any) -> bool:
    return bool(getattr(offer, "inter_node_gbps", None)) and bool(getattr(offer, "inter_node_network", None))


def _layouts_stage(model: ModelSpec, gpn_list: Sequence[int], node_list: Sequence[int], g_max: int,
                   max_gpus: int, stage: str) -> list[Layout]:
    out: list[Layout] = []
    heads = model.attention.num_heads
    for gpn in gpn_list:
        for nodes in node_list:
            if nodes > 1 and gpn != g_max:
                continue  # multi-node plans rent whole instances: use all their GPUs
            world = gpn * nodes
            if world > max_gpus:
                continue
            if stage == "plain":
                if world == 1:
                    out.append(Layout())
                else:
                    out.extend(Layout(gpn, nodes, s) for s in _DP_STRATEGIES)
            elif stage == "parallel":
                for tp in (2, 4, 8):
                    if tp > gpn or heads % tp or world % tp:
                        continue
                    for pp in _pow2_upto(min(world // tp, model.num_layers)):
                        if world % (tp * pp):
                            continue
                        dp = world // (tp * pp)
                        out.append(Layout(gpn, nodes, "single" if dp == 1 else "zero1", tp=tp, pp=pp))
                for pp in _pow2_upto(min(world, model.num_layers))[1:]:
                    if world % pp == 0:
                        dp = world // pp
                        out.append(Layout(gpn, nodes, "single" if dp == 1 else "zero1", pp=pp))
            elif stage == "offload" and world > 1:
                out.append(Layout(gpn, nodes, "zero3", offload_optimizer=True))
                out.append(Layout(gpn, nodes, "zero3", offload_optimizer=True, offload_params=True))
    return out


@dataclass
class _Fits:
    layout: Layout
    job: Job
    memory: MemoryBreakdown


def _fitting_variants(memo: _Memo, vendor: str, layout: Layout, job: Job, cap: float,
                      global_batch: int | None, total_tokens: int | None) -> list[_Fits]:
    """Every (checkpointing, micro-batch) variant of ``job`` on ``layout`` that fits ``cap``."""
    out: list[_Fits] = []
    dp = layout.dp
    if global_batch is not None:
        if global_batch % dp:
            return out
        per_rank = global_batch // dp
    for gc in (False, True):
        mb = 1
        while mb <= _MAX_MICRO_BATCH:
            if global_batch is not None:
                if mb > per_rank:
                    break
                if per_rank % mb:
                    mb *= 2
                    continue
                ga = per_rank // mb
            else:
                ga = job.grad_accum
            variant = job.with_(micro_batch=mb, grad_accum=ga, gradient_checkpointing=gc)
            mem = memo.get(vendor, layout, variant)
            if mem is None or mem.device_total_bytes > cap:
                break  # memory grows with the micro-batch
            out.append(_Fits(layout, variant, mem))
            if total_tokens is not None and mb * job.seq_len * ga * dp >= total_tokens:
                break  # one step already covers the whole dataset
            mb *= 2
    return out


def _min_gpus_zero3(memo: _Memo, model: ModelSpec, job: Job, gpu: Any, cap: float,
                    limit: int = 4096) -> int | None:
    per_node = max(1, int(getattr(gpu, "max_gpus_per_node", 8) or 8))
    j = job.with_(micro_batch=1, grad_accum=1, gradient_checkpointing=True)
    n = 2
    while n <= limit:
        gpn = min(n, per_node)
        if n % gpn == 0:
            mem = memo.get(gpu.vendor, Layout(gpn, n // gpn, "zero3"), j)
            if mem is not None and mem.device_total_bytes <= cap:
                return n
        n *= 2
    return None


def _gb(n: float) -> str:
    return f"{n / GB:,.0f} GB" if n >= 10 * GB else f"{n / GB:,.1f} GB"


# ---------------------------------------------------------------------------------------------
# recommend
# ---------------------------------------------------------------------------------------------
def recommend(
    model: ModelSpec,
    job: Job,
    offers: Iterable[Any],
    *,
    objective: str = "cost",
    deadline_hours: float | None = None,
    budget_usd: float | None = None,
    max_gpus: int | None = None,
    providers: Iterable[str] | None = None,
    gpus: Iterable[str] | None = None,
    pricing: str | None = None,
    safety_margin: float = 0.05,
    global_batch: int | None = None,
    gpu_catalog: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PlanSet:
    """Rank every plan that fits, for ``job.dataset_tokens x job.epochs`` tokens.

    ``global_batch`` (sequences per optimizer step) is kept exactly: grad_accum is chosen per
    layout and micro-batch; without it the job's grad_accum is used. ``gpu_catalog`` maps GPU
    slugs to specs (default: the bundled catalog).
    """
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise ConfigError(f"unknown objective {objective!r}", "use cost or time", field="objective")
    if not job.dataset_tokens:
        raise ConfigError("the planner needs the dataset size", "pass `tokens`, e.g. `tokens=50M`", field="tokens")
    if not 0.0 <= safety_margin < 1.0:
        raise ConfigError(f"safety margin must be in [0, 1) (got {safety_margin})", "e.g. `margin=0.05`",
                          field="margin")
    if max_gpus is not None and max_gpus < 1:
        raise ConfigError(f"max GPUs must be >= 1 (got {max_gpus})", "e.g. `max_gpus=16`", field="max_gpus")
    if global_batch is not None and global_batch < 1:
        raise ConfigError(f"global batch must be >= 1 (got {global_batch})", "e.g. `global_batch=64`",
                          field="global_batch")
    for v, what in ((deadline_hours, "deadline"), (budget_usd, "budget")):
        if v is not None and not v > 0:
            raise ConfigError(f"{what} must be > 0 (got {v})", f"pass a positive `{what}`", field=what)
    validate_job(model, job)
    notes: list[str] = []
    if max_gpus is None:
        max_gpus = DEFAULT_MAX_GPUS
        notes.append(f"searched layouts up to {DEFAULT_MAX_GPUS} GPUs (use --max-gpus to change)")

    from .catalog.offers import filter_offers

    offers = list(offers)
    offers = filter_offers(offers, providers=list(providers) if providers else None,
                           gpus=list(gpus) if gpus else None, pricing=pricing)
    if gpu_catalog is None:
        from .catalog.gpus import load_gpus

        gpu_catalog = load_gpus()

    total_tokens = math.ceil(job.dataset_tokens * job.epochs)
    memo = _Memo(model)
    runtime_cache: dict[tuple, RuntimeEstimate] = {}
    by_gpu: dict[str, list[Any]] = {}
    for o in offers:
        by_gpu.setdefault(o.gpu, []).append(o)

    raw: list[Plan] = []
    infeasible: list[Infeasible] = []
    counts = _Counts()
    gpu_names = sorted(by_gpu)
    for gi, slug in enumerate(gpu_names):
        if progress is not None:
            progress(gi, len(gpu_names))
        gpu = gpu_catalog.get(slug)
        if gpu is None:
            infeasible.append(Infeasible(slug, f"GPU {slug!r} is not in the GPU catalog"))
            continue
        gjob, gnotes, why = platform_job(job, gpu)
        if gjob is None:
            hint = "try --method lora on this GPU" if job.method == "qlora" else None
            infeasible.append(Infeasible(slug, why or "cannot run", hint=hint))
            continue
        cap = gpu.memory_bytes * (1.0 - safety_margin)
        shapes: dict[tuple[int, bool], list[_Fits]] = {}
        gpu_plans = 0
        for offer in by_gpu[slug]:
            fits = _enumerate(memo, model, gjob, gpu, offer, cap, max_gpus, global_batch, total_tokens, shapes,
                              counts)
            best = _best_per_layout(model, gpu, offer, fits, gnotes, runtime_cache, counts)
            raw.extend(best.values())
            gpu_plans += len(best)
        if gpu_plans == 0:
            infeasible.append(_why_not(memo, model, gjob, gpu, cap, safety_margin, by_gpu[slug],
                                       max_gpus, global_batch))
    if progress is not None:
        progress(len(gpu_names), len(gpu_names))

    kept, dropped = _constrain(raw, deadline_hours, budget_usd)
    infeasible.extend(dropped)

    plans = _rank(kept, objective)
    stats = SearchStats(offers=len(offers), gpu_types=len(by_gpu), layouts=counts.layouts,
                        memory_evals=memo.evals, runtime_evals=len(runtime_cache),
                        candidates=counts.candidates, seconds=time.perf_counter() - t0, max_gpus=max_gpus)
    return PlanSet(objective, plans, tuple(infeasible), stats, tuple(notes))


@dataclass
class _Counts:
    """What a search looked at (for SearchStats)."""

    layouts: int = 0
    candidates: int = 0


def _enumerate(memo: _Memo, model: ModelSpec, job: Job, gpu: Any, offer: Any, cap: float, max_gpus: int,
               global_batch: int | None, total_tokens: int, shapes: dict[tuple[int, bool], list[_Fits]],
               counts: _Counts) -> list[_Fits]:
    """Every (layout, micro-batch, checkpointing) that fits ``cap`` on instances of ``offer``.

    Layouts come in stages: plain data parallelism first, tensor/pipeline parallelism and offload
    only when no plain layout fits. Offers of one GPU type with the same instance shape (GPUs per
    instance, inter-node network) share the result (``shapes``).
    """
    g_max = int(offer.gpus_per_instance)
    per_node_cap = int(getattr(gpu, "max_gpus_per_node", 0) or 0)
    if per_node_cap:
        g_max = min(g_max, max(1, per_node_cap))
    net = _has_network(offer)
    shape = (g_max, net)
    if shape not in shapes:
        gpn_list = sorted({*_pow2_upto(g_max), g_max})
        node_list = [1] + ([n for n in _pow2_upto(max_gpus // g_max) if n > 1] if net else [])
        fits: list[_Fits] = []
        for stage in ("plain", "parallel", "offload"):
            lays = _layouts_stage(model, gpn_list, node_list, g_max, max_gpus, stage)
            counts.layouts += len(lays)
            for lay in lays:
                fits.extend(_fitting_variants(memo, gpu.vendor, lay, job, cap, global_batch, total_tokens))
            if fits:
                break  # tensor/pipeline parallelism and offload only when needed
        shapes[shape] = fits
    return shapes[shape]


def _best_per_layout(model: ModelSpec, gpu: Any, offer: Any, fits: list[_Fits], gnotes: list[str],
                     runtime_cache: dict[tuple, RuntimeEstimate], counts: _Counts) -> dict[Layout, Plan]:
    """The fastest fitting variant per layout on ``offer``, priced."""
    best: dict[Layout, Plan] = {}
    for f in fits:
        counts.candidates += 1
        bw = offer.inter_node_gbps if f.layout.nodes > 1 else None
        rkey = (offer.gpu, bw, f.layout, f.job)
        rt = runtime_cache.get(rkey)
        if rt is None:
            rt = estimate_runtime(model, f.job, f.layout, gpu, offer=offer)
            runtime_cache[rkey] = rt
        cur = best.get(f.layout)
        if cur is not None and cur.runtime.total_hours <= rt.total_hours:
            continue
        cost = estimate_cost(rt, offer, f.layout, gpu)
        best[f.layout] = Plan(offer, gpu, f.layout, f.job, f.memory, rt, cost,
                              notes=tuple(gnotes) + f.memory.notes)
    return best


def _constrain(raw: list[Plan], deadline_hours: float | None,
               budget_usd: float | None) -> tuple[list[Plan], list[Infeasible]]:
    """(the plans within the deadline and the budget, why-not of the GPU types that lost all)."""
    kept = raw
    if deadline_hours is not None:
        kept = [p for p in kept if p.hours <= deadline_hours]
    if budget_usd is not None:
        kept = [p for p in kept if p.usd <= budget_usd]
    infeasible = []
    dropped = {p.gpu.name for p in raw} - {p.gpu.name for p in kept}
    for slug in sorted(dropped):
        mine = [p for p in raw if p.gpu.name == slug]
        parts = []
        fastest = min(mine, key=lambda p: p.hours)
        cheapest = min(mine, key=lambda p: p.usd)
        if deadline_hours is not None and fastest.hours > deadline_hours:
            parts.append(f"fastest plan takes {fastest.hours:,.1f} h > deadline {deadline_hours:g} h")
        if budget_usd is not None and cheapest.usd > budget_usd:
            parts.append(f"cheapest plan costs ${cheapest.usd:,.0f} > budget ${budget_usd:,.0f}")
        if not parts:
            parts.append(f"no plan meets both deadline and budget (fastest {fastest.hours:,.1f} h "
                         f"for ${fastest.usd:,.0f}; cheapest ${cheapest.usd:,.0f} in {cheapest.hours:,.1f} h)")
        infeasible.append(Infeasible(slug, "; ".join(parts),
                                     hint="relax --deadline/--budget or raise --max-gpus"))
    return kept, infeasible


def _sort_key(p: Plan, objective: str) -> tuple:
    tie = (p.offer.provider, p.offer.sku, str(getattr(p.offer, "region", "")), p.layout.world_size,
           p.layout.strategy, p.layout.tp, p.layout.pp, p.layout.offload_optimizer,
           p.layout.offload_params, p.layout.gpus_per_node)
    if objective == "time":
        return (p.hours, p.usd, *tie)
    return (p.usd, p.hours, *tie)


def _rank(plans: list[Plan], objective: str) -> tuple[Plan, ...]:
    if not plans:
        return ()
    ordered = sorted(plans, key=lambda p: _sort_key(p, objective))
    cheapest = min(plans, key=lambda p: _sort_key(p, "cost"))
    fastest = min(plans, key=lambda p: _sort_key(p, "time"))
    # Pareto frontier on (usd, hours): sweep by cost, keep strictly faster ones (ties included)
    frontier: set[int] = set()
    best_h = math.inf
    last: tuple[float, float] | None = None
    for p in sorted(plans, key=lambda p: (p.usd, p.hours)):
        if p.hours < best_h:
            frontier.add(id(p))
            best_h = p.hours
            last = (p.usd, p.hours)
        elif last is not None and (p.usd, p.hours) == last:
            frontier.add(id(p))
    out = []
    for p in ordered:
        out.append(Plan(p.offer, p.gpu, p.layout, p.job, p.memory, p.runtime, p.cost,
                        cheapest=p is cheapest, fastest=p is fastest, pareto=id(p) in frontier,
                        notes=p.notes))
    return tuple(out)


def _why_not(memo: _Memo, model: ModelSpec, job: Job, gpu: Any, cap: float, margin: float,
             offers: list[Any], max_gpus: int, global_batch: int | None) -> Infeasible:
    single = memo.get(gpu.vendor, Layout(), job.with_(micro_batch=1, grad_accum=1, gradient_checkpointing=True))
    need = single.device_total_bytes if single is not None else None
    have = gpu.memory_bytes
    g_inst = max(int(o.gpus_per_instance) for o in offers)
    net = any(_has_network(o) for o in offers)
    n3 = _min_gpus_zero3(memo, model, job, gpu, cap)
    hints = []
    if job.method == "full":
        hints.append("try --method lora or qlora")
    elif job.method == "lora" and getattr(gpu, "supports_bitsandbytes", False):
        hints.append("try --method qlora")
    if n3:
        where = f"offers have {g_inst} per instance" + ("" if net else " and no inter-node network")
        if n3 > max_gpus:
            where += f"; --max-gpus is {max_gpus}"
        hints.append(f">={n3} GPUs with zero3 ({where})")
    if job.seq_len > 512:
        hints.append("a shorter --seq-len")
    if global_batch is not None:
        hints.append(f"a --global-batch divisible by the GPU count (now {global_batch})")
    reason = (f"needs {_gb(need)} per GPU, has {_gb(have)} ({_gb(cap)} usable with a "
              f"{margin:.0%} margin)" if need is not None else "no layout is valid for this model")
    if need is not None and need <= cap:
        reason = (f"fits one GPU at micro-batch 1 with checkpointing ({_gb(need)}), but no searched "
                  f"layout fits (within {max_gpus} GPUs and the global batch)")
    return Infeasible(gpu.name, reason, need, have, ", or ".join(hints) if hints else None)


# ---------------------------------------------------------------------------------------------
# fit
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FitResult:
    gpu: str
    memory_bytes: int
    usable_bytes: int
    fits: bool  # the job as given, on one GPU
    device_total_bytes: int | None
    max_seq_len: int | None  # longest sequence on one GPU with the job's micro-batch/checkpointing
    max_micro_batch: int | None  # largest micro-batch on one GPU at the job's sequence length
    min_gpus: dict[str, int | None] = field(default_factory=dict)  # fewest GPUs per strategy
    notes: tuple[str, ...] = ()


def fit(model: ModelSpec, job: Job, gpu: Any, *, safety_margin: float = 0.05,
        max_gpus: int = 1024) -> FitResult:
    """What fits on ``gpu``: longest sequence, largest micro-batch, fewest GPUs per strategy."""
    if not 0.0 <= safety_margin < 1.0:
        raise ConfigError(f"safety margin must be in [0, 1) (got {safety_margin})", "e.g. `margin=0.05`",
                          field="margin")
    validate_job(model, job)
    notes: list[str] = []
    gjob, gnotes, why = platform_job(job, gpu)
    if gjob is None:
        raise ConfigError(why or f"{job.method} cannot run on {gpu.name}", "pick another GPU or method", field="gpu")
    notes.extend(gnotes)
    memo = _Memo(model)
    cap = gpu.memory_bytes * (1.0 - safety_margin)
    v = gpu.vendor

    def ok(layout: Layout, j: Job) -> bool:
        m = memo.get(v, layout, j)
        return m is not None and m.device_total_bytes <= cap

    one = Layout()
    m0 = memo.get(v, one, gjob)
    fits_now = m0 is not None and m0.device_total_bytes <= cap

    # longest sequence: memory grows with seq_len -> binary search
    hi_bound = model.max_position_embeddings or (1 << 20)
    max_seq = None
    if ok(one, gjob.with_(seq_len=1)):
        lo, hi = 1, hi_bound
        if ok(one, gjob.with_(seq_len=hi)):
            lo = hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ok(one, gjob.with_(seq_len=mid)):
                lo = mid
            else:
                hi = mid - 1
        max_seq = lo
        if lo == hi_bound:
            notes.append(f"the longest sequence is bounded by max_position_embeddings {hi_bound}")

    # largest micro-batch: doubling, then binary search
    max_mb = None
    if ok(one, gjob.with_(micro_batch=1)):
        lo = 1
        while lo < _MAX_MICRO_BATCH and ok(one, gjob.with_(micro_batch=lo * 2)):
            lo *= 2
        hi = lo * 2 - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ok(one, gjob.with_(micro_batch=mid)):
                lo = mid
            else:
                hi = mid - 1
        max_mb = lo

    per_node = max(1, int(getattr(gpu, "max_gpus_per_node", 8) or 8))
    min_gpus: dict[str, int | None] = {"single": 1 if fits_now else None}
    variants = {"ddp": {}, "zero2": {}, "zero3": {}, "fsdp": {},
                "zero3+offload": {"offload_optimizer": True},
                "zero3+offload-params": {"offload_optimizer": True, "offload_params": True}}
    for label, extra in variants.items():
        strategy = label.split("+")[0]
        found = None
        n = 2
        while n <= max_gpus:
            gpn = min(n, per_node)
            if n % gpn == 0 and ok(Layout(gpn, n // gpn, strategy, **extra), gjob):
                found = n
                break
            n *= 2
        if found is None and fits_now and strategy != "ddp":
            pass
        min_gpus[label] = found
    return FitResult(gpu=gpu.name, memory_bytes=gpu.memory_bytes, usable_bytes=int(cap), fits=fits_now,
                     device_total_bytes=m0.device_total_bytes if m0 is not None else None,
                     max_seq_len=max_seq, max_micro_batch=max_mb, min_gpus=min_gpus, notes=tuple(notes))
