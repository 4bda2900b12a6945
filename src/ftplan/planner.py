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

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .cost import Cost, estimate_cost
from .errors import ConfigError, FtplanError, Problem, did_you_mean
from .expert_parallel import ep_degrees
from .inputs import check_finite, show_value
from .job import STRATEGIES, Job, Layout, validate_job
from .memory import MemoryBreakdown, estimate_memory
from .model import ModelSpec
from .runtime import RuntimeEstimate, compute_dtype, estimate_runtime, for_dataset, fp32_experts_note
from .units import GB

__all__ = ["Plan", "Infeasible", "PlanSet", "SearchStats", "FitResult", "SearchCache", "recommend", "fit", "platform_job",
           "price_layout", "precision_candidates",
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
    host: Any = None  # HostRequirements (host RAM / disk per node), see ftplan.host
    risk: Any = None  # SpotRisk on preemptible offers, see ftplan.risk

    @property
    def hours(self) -> float:
        """Wall-clock hours: training + start-up."""
        return self.runtime.total_hours or 0.0

    @property
    def usd(self) -> float:
        return self.cost.usd

    @property
    def expected_usd(self) -> float:
        """Cost of the completed job: with preemptions on spot offers, else ``usd``."""
        return self.risk.expected_usd if self.risk is not None else self.cost.usd

    @property
    def expected_hours(self) -> float:
        return self.risk.expected_hours if self.risk is not None else self.hours

    @property
    def strategy_label(self) -> str:
        lo = self.layout
        s = "zero3/fsdp" if lo.strategy in ("zero3", "fsdp") else lo.strategy
        if lo.tp > 1:
            s += f"+tp{lo.tp}"
        if lo.pp > 1:
            s += f"+pp{lo.pp}"
        if lo.ep > 1:
            s += f"+ep{lo.ep}"
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
        return tuple(sorted((p for p in self.plans if p.pareto), key=lambda p: (p.expected_usd, p.expected_hours)))

    def top(self, n: int) -> tuple[Plan, ...]:
        return self.plans[: max(0, n)]

    def best_per_gpu_precision(self) -> tuple[Plan, ...]:
        """The best plan of each (GPU type, precision) pair, in objective order: what each
        precision brings on each GPU when the search covered several (``precisions``)."""
        seen: set[tuple[str, str]] = set()
        out = []
        for p in self.plans:
            key = (p.gpu.name, p.job.precision_label)
            if key not in seen:
                seen.add(key)
                out.append(p)
        return tuple(out)

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


class SearchCache:
    """What searches of a long-lived process can share: memory breakdowns per (model, GPU vendor,
    layout, job) and step times per (model, GPU, inter-node bandwidth, layout, job), the job
    without its data size (``dataset_tokens``/``epochs`` change neither; a step time gets the
    search's totals through :func:`~ftplan.runtime.for_dataset`). Pass one to :func:`recommend`
    (the web app keeps one per process): a search that differs from an earlier one only in its data
    size, objective, constraints or offers evaluates neither again. Bounded: emptied when it holds ``max_entries`` answers. Plain dict
    operations: shareable by threads."""

    def __init__(self, max_entries: int = 50_000) -> None:
        self.max_entries = max_entries
        self.memory: dict[tuple, MemoryBreakdown | None] = {}
        self.runtime: dict[tuple, tuple[Any, RuntimeEstimate]] = {}
        self.jobs: dict[Job, Job] = {}
        self.hits = 0


class _Memo:
    """Memory breakdowns per (vendor, layout, job), shared by all GPU types; counts evaluations.
    With a :class:`SearchCache`, also shared with other searches."""

    def __init__(self, model: ModelSpec, shared: SearchCache | None = None) -> None:
        self.model = model
        self.shared = shared
        self.cache: dict[tuple, MemoryBreakdown | None] = {}
        self.free: dict[Job, Job] = {}
        self.evals = 0

    def _free(self, job: Job) -> Job:
        """``job`` without its data size, one object per value across searches (identity compares)."""
        f = self.free.get(job)
        if f is None:
            f = job if (job.dataset_tokens is None and job.epochs == 1.0) \
                else job.with_(dataset_tokens=None, epochs=1.0)
            sh = self.shared
            if len(sh.jobs) >= sh.max_entries:
                sh.jobs.clear()
            f = self.free[job] = sh.jobs.setdefault(f, f)
        return f

    def step_runtime(self, gpu: Any, offer: Any, bw: float | None, layout: Layout, job: Job) -> RuntimeEstimate:
        """``estimate_runtime`` of ``job`` (an earlier search's step time when shared, with this
        job's totals)."""
        sh = self.shared
        if sh is None:
            return estimate_runtime(self.model, job, layout, gpu, offer=offer)
        key = (self.model, id(gpu), bw, layout, self._free(job))
        hit = sh.runtime.get(key)
        if hit is not None and hit[0] is gpu:  # the same GpuSpec object (a custom catalog has others)
            sh.hits += 1
            return for_dataset(hit[1], job.dataset_tokens, job.epochs)
        rt = estimate_runtime(self.model, job, layout, gpu, offer=offer)
        if len(sh.runtime) >= sh.max_entries:
            sh.runtime.clear()
        sh.runtime[key] = (gpu, rt)
        return rt

    def get(self, vendor: str, layout: Layout, job: Job) -> MemoryBreakdown | None:
        key = (vendor, layout, job)
        if key in self.cache:
            return self.cache[key]
        self.evals += 1  # a breakdown this search needed (computed here or by an earlier search)
        sh = self.shared
        skey = (self.model, vendor, layout, self._free(job)) if sh is not None else None
        if sh is not None and skey in sh.memory:
            sh.hits += 1
            mem = self.cache[key] = sh.memory[skey]
            return mem
        try:
            mem = estimate_memory(self.model, job, layout, gpu_vendor=vendor)
        except ConfigError:
            mem = None  # layout not valid for this model (e.g. tp does not divide heads)
        self.cache[key] = mem
        if sh is not None:
            if len(sh.memory) >= sh.max_entries:
                sh.memory.clear()
            sh.memory[skey] = mem
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
    if job.low_precision is not None:  # FP8 / NVFP4 recipes need the format's tensor cores
        from .lowprec import get_recipe, gpu_problem

        recipe = get_recipe(job.low_precision)
        msg = gpu_problem(recipe, gpu) if recipe is not None else None
        if msg:
            return None, notes, msg
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
                    # MoE: expert-parallel variants within a node (see ftplan.expert_parallel)
                    out.extend(Layout(gpn, nodes, s, ep=k) for k in ep_degrees(model, world, gpn)
                               for s in _DP_STRATEGIES)
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
    rjob: Job | None = None  # the job the runtime sees (a dataset's average batch), else ``job``
    mjob: Job | None = None  # the job memory was taken at (a dataset's largest batch), else ``job``


class _DataShapes:
    """A dataset's batches per micro-batch (see ftplan.dataset): the largest one for memory, the
    average one and the computed (padded) tokens for the runtime."""

    def __init__(self, profile: Any, batching: str) -> None:
        self.profile = profile
        self.batching = batching
        self.cache: dict[tuple, Any] = {}

    def batches(self, job: Job) -> Any:
        from .dataset import simulate_batches

        key = (job.seq_len, job.micro_batch, job.grad_accum if self.batching == "bucketed" else 1)
        b = self.cache.get(key)
        if b is None:
            b = self.cache[key] = simulate_batches(self.profile, self.batching, job.seq_len, job.micro_batch,
                                                   grad_accum=job.grad_accum)
        return b

    def memory_job(self, job: Job) -> Job:
        b = self.batches(job)
        mj = b.memory_job(job)
        return mj.with_(attn_impl="flash") if b.padding_free else mj

    def runtime_job(self, job: Job) -> Job:
        return self.batches(job).runtime_job(job)


@dataclass(frozen=True)
class _Fixed:
    """Choices the user fixed instead of letting the search pick them."""

    micro_batch: int | None = None
    strategy: str | None = None
    num_gpus: int | None = None


def _check_fixed(micro_batch: int | None, strategy: str | None, num_gpus: int | None, max_gpus: int | None) -> None:
    if micro_batch is not None and (isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1):
        raise ConfigError(f"micro-batch must be an integer >= 1 (got {micro_batch!r})", "e.g. `micro_batch=4`",
                          field="micro_batch")
    if num_gpus is not None and (isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1):
        raise ConfigError(f"GPU count must be an integer >= 1 (got {num_gpus!r})", "e.g. `fixed_gpus=8`", field="fixed_gpus")
    if strategy is not None:
        if strategy not in STRATEGIES:
            hint = did_you_mean(strategy, STRATEGIES) or f"use one of {', '.join(STRATEGIES)}"
            raise ConfigError(f"unknown strategy {strategy!r}", hint, field="fixed_strategy")
        if strategy == "single" and num_gpus not in (None, 1):
            raise ConfigError(f"strategy single runs on one GPU, not {num_gpus}",
                              "drop `fixed_gpus`, or pick ddp, fsdp or a ZeRO stage", field="fixed_strategy")
    if num_gpus is not None and max_gpus is not None and num_gpus > max_gpus:
        raise ConfigError(f"{num_gpus} GPUs exceed the {max_gpus} of `max_gpus`",
                          "raise `max_gpus` or lower `fixed_gpus`", field="fixed_gpus")


def _fixed_layouts(lays: list[Layout], stage: str, strategy: str | None, num_gpus: int | None) -> list[Layout]:
    """The layouts that keep a user-fixed strategy and GPU count (the plain stage's data-parallel
    layouts are re-labelled with the fixed strategy: ``fsdp``/``zero1`` are not searched)."""
    if strategy is None and num_gpus is None:
        return lays
    out: list[Layout] = []
    seen: set[Layout] = set()
    for lay in lays:
        if num_gpus is not None and lay.world_size != num_gpus:
            continue
        if strategy is not None:
            if lay.world_size == 1:
                if strategy != "single":
                    continue
            elif stage == "plain" and lay.tp == 1 and lay.pp == 1:
                if strategy == "single":
                    continue
                lay = dataclasses.replace(lay, strategy=strategy)
            elif lay.strategy != strategy and not (lay.dp == 1 and lay.strategy == "single"):
                continue
        if lay not in seen:
            seen.add(lay)
            out.append(lay)
    return out


def _fitting_variants(memo: _Memo, vendor: str, layout: Layout, job: Job, cap: float,
                      global_batch: int | None, total_tokens: int | None,
                      data: _DataShapes | None = None, fixed_micro_batch: int | None = None) -> list[_Fits]:
    """Every (checkpointing, micro-batch) variant of ``job`` on ``layout`` that fits ``cap``
    (with ``data``: memory at the largest batch the loader forms from the dataset; only
    ``fixed_micro_batch`` when given)."""
    out: list[_Fits] = []
    dp = layout.dp
    if global_batch is not None:
        if global_batch % dp:
            return out
        per_rank = global_batch // dp
    for gc in (False, True):
        mb = fixed_micro_batch or 1
        while mb <= max(_MAX_MICRO_BATCH, fixed_micro_batch or 0):
            if global_batch is not None:
                if mb > per_rank:
                    break
                if per_rank % mb:
                    if fixed_micro_batch:
                        break
                    mb *= 2
                    continue
                ga = per_rank // mb
            else:
                ga = job.grad_accum
            variant = job.with_(micro_batch=mb, grad_accum=ga, gradient_checkpointing=gc)
            mjob = data.memory_job(variant) if data is not None else None
            mem = memo.get(vendor, layout, mjob or variant)
            if mem is None or mem.device_total_bytes > cap:
                break  # memory grows with the micro-batch
            out.append(_Fits(layout, variant, mem, data.runtime_job(variant) if data is not None else None, mjob))
            if fixed_micro_batch or (total_tokens is not None and mb * job.seq_len * ga * dp >= total_tokens):
                break  # the one micro-batch asked for / one step already covers the whole dataset
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
def precision_candidates(model: ModelSpec, job: Job, precisions: Sequence[str] | None,
                         notes: list[str]) -> list[Job]:
    """The job variants a search runs: ``job`` itself, or one per precision / FP8-FP4 recipe in
    ``precisions`` (``auto``: ``lowprec.auto_precisions``) that is valid for the model and method
    (the others are named in ``notes``)."""
    if not precisions:
        return [job]
    from .lowprec import apply_precision, auto_precisions

    names: list[str] = []
    for name in precisions:
        names += list(auto_precisions(job.method, job.precision)) if name == "auto" else [name]
    out: list[Job] = []
    seen: set[tuple[str, str | None]] = set()
    for name in names:
        cjob = apply_precision(job, name)
        if (cjob.precision, cjob.low_precision) in seen:
            continue
        try:
            validate_job(model, cjob)
        except ConfigError as e:
            notes.append(f"precision {name} not searched: {e.message}")
            continue
        seen.add((cjob.precision, cjob.low_precision))
        out.append(cjob)
    if not out:
        raise ConfigError(f"none of the precisions {', '.join(names)} can run {job.method} on {model.name}",
                          "use `precision=bf16-mixed`", field="precision")
    return out


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
    micro_batch: int | None = None,
    strategy: str | None = None,
    num_gpus: int | None = None,
    precisions: Sequence[str] | None = None,
    target: str | None = "accelerate",
    preemption_rate: float | None = None,
    checkpoint_interval_s: float | None = None,
    dataset: Any | None = None,
    batching: str = "longest",
    cache: SearchCache | None = None,
) -> PlanSet:
    """Rank every plan that fits, for ``job.dataset_tokens x job.epochs`` tokens.

    ``precisions``: also search these precisions / FP8-FP4 recipes (``("auto",)``: the base
    precision plus one FP8 and one FP4 recipe for the method, ``lowprec.auto_precisions``); each
    GPU type runs the ones it supports, and plans carry their precision in ``plan.job``.

    Every plan carries the host RAM / disk it needs (``Plan.host``); an offer whose instance is
    known to lack the host RAM is rejected with the reason. Spot offers carry the expected cost
    and time with preemptions (``Plan.risk``; ``preemption_rate`` per instance-hour overrides the
    catalog's, ``checkpoint_interval_s`` the optimum interval) and are ranked on it.

    ``dataset`` (a ``ftplan.dataset.DatasetProfile``): memory is taken at the largest batch the
    loader forms under ``batching`` with ``job.seq_len`` as max length, time and cost from the
    tokens it computes (``job.dataset_tokens`` defaults to the dataset's tokens).

    ``global_batch`` (sequences per optimizer step) is kept exactly: grad_accum is chosen per
    layout and micro-batch; without it the job's grad_accum is used. ``gpu_catalog`` maps GPU
    slugs to specs (default: the bundled catalog). ``cache`` shares memory breakdowns with other
    searches (:class:`SearchCache`); the plans are the same with or without it. ``target`` (an export target of
    :mod:`ftplan.export.targets`) keeps only layouts whose exported files run them; the reasons
    for the others are in ``PlanSet.notes``. ``None`` ranks every layout. ``micro_batch``,
    ``strategy`` and ``num_gpus`` fix those choices instead of searching them (a layout the user
    has in mind).
    """
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise ConfigError(f"unknown objective {objective!r}", "use cost or time", field="objective")
    data = None
    if dataset is not None:
        data = _DataShapes(dataset, batching)
        data.batches(job)  # validates the batching now (one clear error)
        if not job.dataset_tokens:
            job = job.with_(dataset_tokens=data.batches(job).real_tokens)
    if not job.dataset_tokens:
        raise ConfigError("the planner needs the dataset size", "pass `tokens`, e.g. `tokens=50M`", field="tokens")
    _check_search(safety_margin, max_gpus, global_batch, deadline_hours, budget_usd)
    _check_fixed(micro_batch, strategy, num_gpus, max_gpus)
    validate_job(model, job)
    keep = _runnable_filter(model, target)  # the export rule (export.targets)
    if num_gpus is not None and max_gpus is None:
        max_gpus = num_gpus
    fixed = _Fixed(micro_batch, strategy, num_gpus)
    kept = [f"micro-batch {micro_batch}" if micro_batch else "", f"strategy {strategy}" if strategy else "",
            f"{num_gpus} GPU{'s' if num_gpus != 1 else ''}" if num_gpus else ""]
    kept_note = ", ".join(k for k in kept if k)
    notes: list[str] = [f"kept as given (not searched): {kept_note}"] if kept_note else []
    candidates = precision_candidates(model, job, precisions, notes)
    if max_gpus is None:
        max_gpus = DEFAULT_MAX_GPUS
        notes.append(f"searched layouts up to {DEFAULT_MAX_GPUS} GPUs (use `max_gpus` to change)")

    from .catalog.offers import filter_offers

    offers = list(offers)
    offers = filter_offers(offers, providers=list(providers) if providers else None,
                           gpus=list(gpus) if gpus else None, pricing=pricing)
    if gpu_catalog is None:
        from .catalog.gpus import load_gpus

        gpu_catalog = load_gpus()

    total_tokens = math.ceil(job.dataset_tokens * job.epochs)
    memo = _Memo(model, cache)
    runtime_cache: dict[tuple, RuntimeEstimate] = {}
    by_gpu: dict[str, list[Any]] = {}
    for o in offers:
        by_gpu.setdefault(o.gpu, []).append(o)

    raw: list[Plan] = []
    infeasible: list[Infeasible] = []
    counts = _Counts()
    extras = _Extras(preemption_rate, checkpoint_interval_s)
    gpu_names = sorted(by_gpu)
    for gi, slug in enumerate(gpu_names):
        if progress is not None:
            progress(gi, len(gpu_names))
        gpu = gpu_catalog.get(slug)
        if gpu is None:
            infeasible.append(Infeasible(slug, f"GPU {slug!r} is not in the GPU catalog"))
            continue
        cap = gpu.memory_bytes * (1.0 - safety_margin)
        gpu_plans = 0
        runnable: Job | None = None
        refused: list[str] = []
        for cjob in candidates:  # the job, or one variant per searched precision
            gjob, gnotes, why = platform_job(cjob, gpu)
            if gjob is None:
                refused.append(why or "cannot run")
                continue
            runnable = runnable or gjob
            shapes: dict[tuple[int, bool], list[_Fits]] = {}
            for offer in by_gpu[slug]:
                fits = _enumerate(memo, model, gjob, gpu, offer, cap, max_gpus, global_batch, total_tokens,
                                  shapes, counts, keep, data, fixed)
                best = _best_per_layout(model, gpu, offer, fits, gnotes, runtime_cache, counts, extras, memo)
                raw.extend(best.values())
                gpu_plans += len(best)
        if runnable is None:
            hint = "try `method=lora` on this GPU" if job.method == "qlora" else None
            infeasible.append(Infeasible(slug, refused[0], hint=hint))
        elif gpu_plans == 0 and slug in extras.host_rejects:
            offer, why_host = extras.host_rejects[slug][0]
            infeasible.append(Infeasible(slug, f"{offer.provider} {offer.sku}: {why_host}",
                                         hint="an instance with more host RAM, or a layout without CPU offload"))
        elif gpu_plans == 0:
            infeasible.append(_why_not(memo, model, runnable, gpu, cap, safety_margin, by_gpu[slug],
                                       max_gpus, global_batch))
        elif slug in extras.host_rejects:
            seen_offers = set()
            for offer, why_host in extras.host_rejects[slug]:
                if id(offer) not in seen_offers:
                    seen_offers.add(id(offer))
                    notes.append(f"rejected {offer.provider} {offer.sku} ({slug}): {why_host}")
    if progress is not None:
        progress(len(gpu_names), len(gpu_names))

    kept, dropped = _constrain(raw, deadline_hours, budget_usd)
    infeasible.extend(dropped)
    for why in sorted(counts.left_out):
        notes.append(f"left out layouts that the {target} export cannot run: {why} "
                     "(`target=any` ranks them)")

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
    #: reasons of the layouts the export target cannot run (left out of the search)
    left_out: set[str] = field(default_factory=set)


def _runnable_filter(model: ModelSpec, target: str | None):
    """Keep the layouts ``target``'s exported files run (``export.targets.exportable``); None: keep all."""
    if target is None:
        return None
    from .export.targets import check_target, exportable

    check_target(target)

    def keep(layouts: list[Layout], job: Job, counts: _Counts) -> list[Layout]:
        out = []
        for lay in layouts:
            ok, why = exportable(lay, job, target, model)
            if ok:
                out.append(lay)
            else:
                counts.left_out.add(why)
        return out

    return keep


def _enumerate(memo: _Memo, model: ModelSpec, job: Job, gpu: Any, offer: Any, cap: float, max_gpus: int,
               global_batch: int | None, total_tokens: int, shapes: dict[tuple[int, bool], list[_Fits]],
               counts: _Counts, keep=None, data: _DataShapes | None = None,
               fixed: _Fixed | None = None) -> list[_Fits]:
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
            if fixed is not None:
                lays = _fixed_layouts(lays, stage, fixed.strategy, fixed.num_gpus)
            if keep is not None:  # only layouts the export target runs (PP is never run for HF models)
                lays = keep(lays, job, counts)
            counts.layouts += len(lays)
            for lay in lays:
                fits.extend(_fitting_variants(memo, gpu.vendor, lay, job, cap, global_batch, total_tokens, data,
                                              fixed.micro_batch if fixed is not None else None))
            if fits:
                break  # tensor/pipeline parallelism and offload only when needed
        shapes[shape] = fits
    return shapes[shape]


class _Extras:
    """Per-search state of the host / spot checks: the options, a cache of host requirements per
    (layout, job) and the offers rejected for host RAM per GPU type."""

    def __init__(self, preemption_rate: float | None, checkpoint_interval_s: float | None) -> None:
        self.preemption_rate = preemption_rate
        self.checkpoint_interval_s = checkpoint_interval_s
        self.cache: dict[tuple, Any] = {}
        self.host_rejects: dict[str, list[tuple[Any, str]]] = {}


def _best_per_layout(model: ModelSpec, gpu: Any, offer: Any, fits: list[_Fits], gnotes: list[str],
                     runtime_cache: dict[tuple, RuntimeEstimate], counts: _Counts,
                     extras: _Extras | None = None, memo: _Memo | None = None) -> dict[Layout, Plan]:
    """The fastest fitting variant per layout on ``offer``, priced; with ``extras``: the host RAM /
    disk it needs (offers lacking the RAM are rejected) and, on spot offers, the expected cost."""
    extras = extras or _Extras(None, None)
    best: dict[Layout, Plan] = {}
    for f in fits:
        counts.candidates += 1
        bw = offer.inter_node_gbps if f.layout.nodes > 1 else None
        rjob = f.rjob or f.job
        rkey = (offer.gpu, bw, f.layout, rjob)
        rt = runtime_cache.get(rkey)
        if rt is None:
            if memo is not None and f.layout.ep == 1:
                rt = memo.step_runtime(gpu, offer, bw, f.layout, rjob)
            else:
                rt = estimate_runtime(model, rjob, f.layout, gpu, offer=offer)  # EP all-to-alls included
            runtime_cache[rkey] = rt
        cur = best.get(f.layout)
        if cur is not None and cur.runtime.total_hours <= rt.total_hours:
            continue
        cost = estimate_cost(rt, offer, f.layout, gpu)
        host, risk, reject, xnotes = _plan_extras(model, f, offer, rt, extras.cache, extras.preemption_rate,
                                                  extras.checkpoint_interval_s)
        if reject is not None:
            extras.host_rejects.setdefault(offer.gpu, []).append((offer, reject))
            continue
        if f.mjob is not None and f.rjob is not None:
            xnotes = (f"dataset: memory at the largest batch, {f.mjob.micro_batch} x {f.mjob.seq_len} tokens; "
                      f"time from {f.rjob.dataset_tokens:,} computed tokens per epoch; $/M tokens per real token",
                      ) + xnotes
            real = (f.job.dataset_tokens or 0) * f.job.epochs
            if real:
                cost = replace(cost, usd_per_million_tokens=cost.usd / real * 1e6)
        xnote = fp32_experts_note(model, rjob, f.layout, gpu, rt)
        best[f.layout] = Plan(offer, gpu, f.layout, f.job, f.memory, rt, cost,
                              notes=tuple(gnotes) + f.memory.notes + xnotes + ((xnote,) if xnote else ()),
                              host=host, risk=risk)
    return best


def _constrain(raw: list[Plan], deadline_hours: float | None,
               budget_usd: float | None) -> tuple[list[Plan], list[Infeasible]]:
    """(the plans within the deadline and the budget, why-not of the GPU types that lost all)."""
    kept = raw
    if deadline_hours is not None:
        kept = [p for p in kept if p.expected_hours <= deadline_hours]
    if budget_usd is not None:
        kept = [p for p in kept if p.expected_usd <= budget_usd]
    infeasible = []
    dropped = {p.gpu.name for p in raw} - {p.gpu.name for p in kept}
    for slug in sorted(dropped):
        mine = [p for p in raw if p.gpu.name == slug]
        parts = []
        fastest = min(mine, key=lambda p: p.expected_hours)
        cheapest = min(mine, key=lambda p: p.expected_usd)
        if deadline_hours is not None and fastest.expected_hours > deadline_hours:
            parts.append(f"fastest plan takes {fastest.expected_hours:,.1f} h > deadline {deadline_hours:g} h")
        if budget_usd is not None and cheapest.expected_usd > budget_usd:
            parts.append(f"cheapest plan costs ${cheapest.expected_usd:,.0f} > budget ${budget_usd:,.0f}")
        if not parts:
            parts.append(f"no plan meets both deadline and budget (fastest {fastest.expected_hours:,.1f} h "
                         f"for ${fastest.expected_usd:,.0f}; cheapest ${cheapest.expected_usd:,.0f} in {cheapest.expected_hours:,.1f} h)")
        infeasible.append(Infeasible(slug, "; ".join(parts),
                                     hint="relax `deadline` / `budget` or raise `max_gpus`"))
    return kept, infeasible


def _plan_extras(model: ModelSpec, f: _Fits, offer: Any, rt: RuntimeEstimate, cache: dict,
                 preemption_rate: float | None, checkpoint_interval_s: float | None):
    """(host requirements, spot risk or None, why the offer's instance cannot hold it, notes)."""
    from .host import check_offer, disk_note, host_requirements
    from .risk import spot_risk

    key = (f.layout, f.job)
    host = cache.get(key)
    if host is None:
        host = cache[key] = host_requirements(model, f.job, f.layout, f.memory)
    reject = check_offer(host, offer)
    notes: tuple[str, ...] = ()
    dn = disk_note(host, offer)
    if dn:
        notes += (dn,)
    risk = None
    if reject is None and offer.pricing == "spot":
        risk = spot_risk(rt, offer, f.layout, host.checkpoint, rate_per_hour=preemption_rate,
                         checkpoint_interval_s=checkpoint_interval_s)
        if risk.rate_assumed:
            notes += (f"no published preemption rate for {offer.provider}: {risk.rate_per_hour:g}/h assumed "
                      "(pass `preemption_rate`)",)
    return host, risk, reject, notes


#: sanity bounds on search constraints (validation limits): a deadline of a century, a budget of a
#: trillion dollars, a million GPUs are already far beyond any fine-tuning job
_MAX_DEADLINE_HOURS = 24 * 366 * 100
_MAX_BUDGET_USD = 1e12
_MAX_SEARCH_GPUS = 1 << 20
_MAX_GLOBAL_BATCH = 1 << 30


def _check_search(safety_margin: float, max_gpus: int | None, global_batch: int | None,
                  deadline_hours: float | None = None, budget_usd: float | None = None) -> None:
    """One ConfigError listing every bad search constraint (NaN, infinity, wrong type, out of range)."""
    p: list[Problem] = []

    def bad(field: str, msg: str, hint: str | None = None) -> None:
        p.append(Problem(field, msg, hint))

    def number(v, field: str, words: str, integer: bool = False) -> bool:
        found: list[str] = []
        if check_finite(v, words, integer=integer, problems=found):
            return True
        bad(field, found[0])
        return False

    if number(safety_margin, "margin", "safety margin") and not 0.0 <= safety_margin < 1.0:
        bad("margin", f"safety margin must be in [0, 1) (got {safety_margin})", "e.g. `margin=0.05`")
    if max_gpus is not None and number(max_gpus, "max_gpus", "max GPUs", integer=True):
        if max_gpus < 1:
            bad("max_gpus", f"max GPUs must be >= 1 (got {max_gpus})", "e.g. `max_gpus=16`")
        elif max_gpus > _MAX_SEARCH_GPUS:
            bad("max_gpus", f"max GPUs {show_value(max_gpus)} is implausibly many (at most {_MAX_SEARCH_GPUS:,})")
    if global_batch is not None and number(global_batch, "global_batch", "global batch", integer=True):
        if global_batch < 1:
            bad("global_batch", f"global batch must be >= 1 (got {global_batch})", "e.g. `global_batch=64`")
        elif global_batch > _MAX_GLOBAL_BATCH:
            bad("global_batch", f"global batch {show_value(global_batch)} is implausibly large "
                                f"(at most {_MAX_GLOBAL_BATCH:,})")
    for v, what, hi in ((deadline_hours, "deadline", _MAX_DEADLINE_HOURS), (budget_usd, "budget", _MAX_BUDGET_USD)):
        if v is not None and number(v, what, what):
            if not v > 0:
                bad(what, f"{what} must be > 0 (got {v})", f"pass a positive `{what}`")
            elif v > hi:
                bad(what, f"{what} {v:g} is implausibly large (at most {hi:g})")
    if p:
        raise ConfigError(problems=p)


def _sort_key(p: Plan, objective: str) -> tuple:
    tie = (p.offer.provider, p.offer.sku, str(getattr(p.offer, "region", "")), p.layout.world_size,
           p.layout.strategy, p.layout.tp, p.layout.pp, p.layout.offload_optimizer,
           p.layout.offload_params, p.layout.gpus_per_node, p.layout.ep)
    if objective == "time":
        return (p.expected_hours, p.expected_usd, *tie)
    return (p.expected_usd, p.expected_hours, *tie)


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
    for p in sorted(plans, key=lambda p: (p.expected_usd, p.expected_hours)):
        if p.expected_hours < best_h:
            frontier.add(id(p))
            best_h = p.expected_hours
            last = (p.expected_usd, p.expected_hours)
        elif last is not None and (p.expected_usd, p.expected_hours) == last:
            frontier.add(id(p))
    out = []
    for p in ordered:
        out.append(replace(p, cheapest=p is cheapest, fastest=p is fastest, pareto=id(p) in frontier))
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
        hints.append("try `method=lora` or `method=qlora`")
    elif job.method == "lora" and getattr(gpu, "supports_bitsandbytes", False):
        hints.append("try `method=qlora`")
    if n3:
        where = f"offers have {g_inst} per instance" + ("" if net else " and no inter-node network")
        if n3 > max_gpus:
            where += f"; `max_gpus` is {max_gpus}"
        hints.append(f">={n3} GPUs with zero3 ({where})")
    if job.seq_len > 512:
        hints.append("a shorter `seq_len`")
    if global_batch is not None:
        hints.append(f"a `global_batch` divisible by the GPU count (now {global_batch})")
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
    #: when the job does not fit one GPU: the single changes that make it fit (ftplan.advice)
    advice: tuple = ()
    #: with a dataset: % of samples kept untruncated -> the sequence-length cut-off that does it
    seq_len_cutoffs: dict[float, int] = field(default_factory=dict)


def fit(model: ModelSpec, job: Job, gpu: Any, *, safety_margin: float = 0.05,
        max_gpus: int = 1024, dataset: Any | None = None,
        keep_pct: Sequence[float] = (90.0, 95.0, 99.0, 100.0)) -> FitResult:
    """What fits on ``gpu``: longest sequence, largest micro-batch, fewest GPUs per strategy;
    with ``dataset`` (a ``DatasetProfile``), the sequence-length cut-off that keeps each
    ``keep_pct`` % of its samples untruncated, and whether it fits one GPU."""
    _check_search(safety_margin, max_gpus, None)
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
    advice = ()
    if not fits_now:
        from .advice import fit_advice

        advice = fit_advice(model, gjob, one, gpu, margin=safety_margin)
    cutoffs: dict[float, int] = {}
    if dataset is not None:
        for pct in keep_pct:
            cut = dataset.cutoff(pct)
            cutoffs[float(pct)] = cut
            ok_one = max_seq is not None and cut <= max_seq
            notes.append(f"{pct:g} % of the samples untruncated: `seq_len={cut}` "
                         + ("fits one GPU" if ok_one else "does not fit one GPU at this micro-batch"))
    return FitResult(gpu=gpu.name, memory_bytes=gpu.memory_bytes, usable_bytes=int(cap), fits=fits_now,
                     advice=advice,
                     device_total_bytes=m0.device_total_bytes if m0 is not None else None,
                     max_seq_len=max_seq, max_micro_batch=max_mb, min_gpus=min_gpus, notes=tuple(notes),
                     seq_len_cutoffs=cutoffs)


# ---------------------------------------------------------------------------------------------
# one fixed layout
# ---------------------------------------------------------------------------------------------
def price_layout(model: ModelSpec, job: Job, layout: Layout, gpu: Any, offers: Iterable[Any], *,
                 providers: Iterable[str] | None = None, pricing: str | None = None,
                 safety_margin: float = 0.05) -> Plan | Infeasible:
    """The job on exactly this layout of ``gpu``, priced on the cheapest matching offer.

    An offer matches when it sells ``gpu`` with at least ``layout.gpus_per_node`` GPUs per
    instance (``layout.nodes`` instances; several nodes need an offer with an inter-node network).
    The cost counts whole instances. Returns an :class:`Infeasible` (with the reason) when the
    layout does not fit the GPU's memory or no offer matches. Needs ``job.dataset_tokens``.
    """
    from .catalog.offers import filter_offers

    if not job.dataset_tokens:
        raise ConfigError("pricing a layout needs the dataset size", "pass `tokens`, e.g. `tokens=50M`", field="tokens")
    validate_job(model, job, layout)
    name = getattr(gpu, "name", str(gpu))
    gjob, notes, why = platform_job(job, gpu)
    if gjob is None:
        return Infeasible(name, why or "cannot run")
    mem = estimate_memory(model, gjob, layout, gpu_vendor=getattr(gpu, "vendor", None))
    cap = gpu.memory_bytes * (1.0 - safety_margin)
    if mem.device_total_bytes > cap:
        return Infeasible(name, f"needs {_gb(mem.device_total_bytes)} per GPU, {name} has {_gb(cap)} usable",
                          needed_bytes=int(mem.device_total_bytes), available_bytes=int(cap),
                          hint="more GPUs, a sharding strategy, checkpointing or a smaller micro-batch")
    cands = [o for o in filter_offers(list(offers), providers=list(providers) if providers else None,
                                      gpus=[name], pricing=pricing)
             if int(o.gpus_per_instance) >= layout.gpus_per_node and (layout.nodes == 1 or _has_network(o))]
    if not cands:
        need = f"{layout.gpus_per_node} x {name} per instance" + (" with an inter-node network" if layout.nodes > 1 else "")
        return Infeasible(name, f"no offer sells {need}", hint="another `gpu`, fewer `gpus` per node, or other `pricing`/`providers`")
    best: Plan | None = None
    for o in cands:
        rt = estimate_runtime(model, gjob, layout, gpu, offer=o if layout.nodes > 1 else None)
        cost = estimate_cost(rt, o, layout, gpu)
        xnote = fp32_experts_note(model, gjob, layout, gpu, rt)
        plan = Plan(o, gpu, layout, gjob, mem, rt, cost,
                    notes=tuple(notes) + tuple(mem.notes) + ((xnote,) if xnote else ()))
        if best is None or _sort_key(plan, "cost") < _sort_key(best, "cost"):
            best = plan
    return best
