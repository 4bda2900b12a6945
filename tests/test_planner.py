"""Planner properties (hypothesis) and a few fixed cases; small models keep it fast.

The property tests over random offer sets share one :class:`~ftplan.planner.SearchCache` (as the
web app's searches do): the plans are exactly those of uncached searches
(``tests/test_bad_input_measure.py::test_search_cache_changes_no_plan``), and the memory and step
time of a (GPU, layout, job) already seen are not evaluated again, so each example costs a
fraction of a fresh search. ``test_no_traceback_over_random_options`` and the fixed cases search
without it."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftplan.catalog.gpus import load_gpus
from ftplan.catalog.models import resolve_model
from ftplan.catalog.offers import Offer
from ftplan.errors import FtplanError
from ftplan.job import Job
from ftplan.planner import SearchCache, fit, recommend

GPUS = ["h100-sxm", "a100-80gb-sxm", "l40s", "rtx-4090", "b200", "mi300x"]
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def small():
    return resolve_model("qwen2.5-0.5b")


#: shared by the property tests' searches (see the module docstring)
CACHE = SearchCache()


def offer(gpu="h100-sxm", n=8, price=2.0, net=400.0, gran=1, provider="p", sku=None, pricing="on-demand"):
    return Offer(provider=provider, sku=sku or f"{gpu}-{n}-{price}", gpu=gpu, gpus_per_instance=n,
                 usd_per_gpu_hour=price, pricing=pricing, region=None,
                 inter_node_network="ib" if net else None, inter_node_gbps=net or None,
                 billing_granularity_s=gran, as_of=dt.date(2026, 1, 1), source="test", notes=None)


offer_st = st.builds(
    offer,
    gpu=st.sampled_from(GPUS),
    n=st.sampled_from([1, 2, 4, 8]),
    price=st.floats(0.2, 20.0),
    net=st.sampled_from([0.0, 100.0, 3200.0]),
    gran=st.sampled_from([None, 1, 60, 3600]),
    provider=st.sampled_from(["a", "b", "c"]),
)


def _run(model, offers, **kw):
    job = kw.pop("job", Job(method="lora", seq_len=1024, dataset_tokens=5_000_000))
    return recommend(model, job, offers, max_gpus=kw.pop("max_gpus", 16), cache=CACHE, **kw)


@SETTINGS
@given(offers=st.lists(offer_st, min_size=1, max_size=4))
def test_cost_is_price_times_gpus_times_time(small, offers):
    ps = _run(small, offers)
    for p in ps.plans:
        gran_h = (p.offer.billing_granularity_s or 0) / 3600
        exact = p.layout.nodes * p.offer.gpus_per_instance * p.offer.usd_per_gpu_hour * p.hours
        assert exact - 1e-9 <= p.usd <= exact + p.layout.nodes * p.offer.usd_per_instance_hour * gran_h + 1e-9
        assert p.memory.device_total_bytes <= p.gpu.memory_bytes * 0.95
        if p.cost.energy_kwh is not None:
            assert p.cost.energy_kwh == pytest.approx(p.layout.world_size * p.gpu.tdp_w * p.hours / 1000)


@SETTINGS
@given(offers=st.lists(offer_st, min_size=1, max_size=4), deadline=st.floats(0.05, 5.0),
       budget=st.floats(0.5, 200.0), objective=st.sampled_from(["cost", "time"]))
def test_constraints_and_pareto(small, offers, deadline, budget, objective):
    ps = _run(small, offers, deadline_hours=deadline, budget_usd=budget, objective=objective)
    key = (lambda p: p.usd) if objective == "cost" else (lambda p: p.hours)
    assert [key(p) for p in ps.plans] == sorted(key(p) for p in ps.plans)
    for p in ps.plans:
        assert p.hours <= deadline and p.usd <= budget
    front = [p for p in ps.plans if p.pareto]
    for a in front:
        for b in ps.plans:
            assert not (b.usd <= a.usd and b.hours <= a.hours and (b.usd < a.usd or b.hours < a.hours))
    for b in ps.plans:  # every non-frontier plan is dominated by (or ties) a frontier plan
        if not b.pareto:
            assert any(a.usd <= b.usd and a.hours <= b.hours for a in front)
    if ps.plans:
        assert sum(p.cheapest for p in ps.plans) == 1 and sum(p.fastest for p in ps.plans) == 1


@SETTINGS
@given(offers=st.lists(offer_st, min_size=1, max_size=3), extra=offer_st,
       objective=st.sampled_from(["cost", "time"]))
def test_adding_an_offer_never_makes_best_worse(small, offers, extra, objective):
    a = _run(small, offers, objective=objective)
    b = _run(small, offers + [extra], objective=objective)
    if a.best is not None:
        assert b.best is not None
        if objective == "cost":
            assert b.best.usd <= a.best.usd + 1e-9
        else:
            assert b.best.hours <= a.best.hours + 1e-12


@SETTINGS
@given(method=st.sampled_from(["full", "lora", "qlora", "bogus"]), seq=st.sampled_from([0, 1, 128, 4096]),
       tokens=st.sampled_from([None, 1, 10**6, 10**9]), objective=st.sampled_from(["cost", "time", "x"]),
       margin=st.sampled_from([-0.1, 0.0, 0.05, 0.5, 1.0]), max_gpus=st.sampled_from([None, 0, 1, 8]),
       gb=st.sampled_from([None, 0, 1, 7, 64]), attn=st.sampled_from(["sdpa", "flash", "eager"]),
       offers=st.lists(offer_st, min_size=0, max_size=3))
def test_no_traceback_over_random_options(small, method, seq, tokens, objective, margin, max_gpus, gb,
                                          attn, offers):
    job = Job(method=method, seq_len=seq, dataset_tokens=tokens, attn_impl=attn)
    try:
        ps = recommend(small, job, offers, objective=objective, safety_margin=margin, max_gpus=max_gpus,
                       global_batch=gb)
    except FtplanError:
        return
    for p in ps.plans:
        if gb:
            assert p.job.micro_batch * p.job.grad_accum * p.layout.dp == gb
        assert p.usd > 0 and p.hours > 0


def test_global_batch_kept_and_infeasible_reasons(small):
    big = resolve_model("llama-3.1-70b")
    job = Job(method="full", seq_len=2048, dataset_tokens=10**7)
    ps = recommend(big, job, [offer("rtx-4090", 1, 0.3, net=0)], max_gpus=8)
    assert not ps.plans
    (why,) = ps.infeasible
    assert "needs" in why.reason and "per GPU, has" in why.reason and "qlora" in why.hint
    ps = recommend(small, Job(seq_len=512, dataset_tokens=10**6), [offer("h100-sxm", 8)], global_batch=32,
                   max_gpus=8)
    assert ps.plans and all(p.job.micro_batch * p.job.grad_accum * p.layout.dp == 32 for p in ps.plans)


def test_qlora_dropped_where_no_bitsandbytes(small):
    gpus = load_gpus()
    no_bnb = [g for g in gpus.values() if not g.supports_bitsandbytes]
    if not no_bnb:
        pytest.skip("every catalog GPU supports bitsandbytes")
    ps = recommend(small, Job(method="qlora", dataset_tokens=10**6), [offer(no_bnb[0].name, 8)])
    assert not ps.plans and "bitsandbytes" in ps.infeasible[0].reason


def test_fit_small_model(small):
    r = fit(small, Job(method="lora", seq_len=2048), load_gpus()["h100-sxm"])
    assert r.fits and r.max_seq_len >= 2048 and r.max_micro_batch >= 1
    assert r.min_gpus["single"] == 1
    assert math.isfinite(r.device_total_bytes)
