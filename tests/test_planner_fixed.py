"""recommend with a layout the user has in mind: fixed micro-batch, strategy and GPU count."""

from __future__ import annotations

import pytest

from ftplan.catalog.models import resolve_model
from ftplan.catalog.offers import load_offers
from ftplan.errors import ConfigError
from ftplan.job import Job
from ftplan.planner import recommend


@pytest.fixture(scope="module")
def model():
    return resolve_model("llama-3.2-3b")


@pytest.fixture(scope="module")
def offers():
    return load_offers()


def test_fixed_choices_are_kept(model, offers):
    job = Job(method="lora", seq_len=1024, dataset_tokens=20_000_000)
    ps = recommend(model, job, offers, micro_batch=4, strategy="fsdp", num_gpus=4)
    assert ps.plans
    for p in ps.plans:
        assert p.job.micro_batch == 4 and p.layout.strategy == "fsdp" and p.layout.world_size == 4
    single = recommend(model, job, offers, micro_batch=3, num_gpus=1)
    assert single.plans and {(p.layout.world_size, p.job.micro_batch) for p in single.plans} == {(1, 3)}
    # without them the search is free: other micro-batches and GPU counts appear
    free = recommend(model, job, offers, max_gpus=8)
    assert len({p.job.micro_batch for p in free.plans}) > 1 and len({p.layout.world_size for p in free.plans}) > 1


@pytest.mark.parametrize("kw", [{"micro_batch": 0}, {"num_gpus": 0}, {"strategy": "fsdp2"},
                                {"strategy": "single", "num_gpus": 4}, {"num_gpus": 16, "max_gpus": 8}])
def test_bad_fixed_choices_are_one_clear_error(model, offers, kw):
    with pytest.raises(ConfigError):
        recommend(model, Job(method="lora", dataset_tokens=10**6), offers, **kw)


def test_price_layout_picks_the_cheapest_matching_offer(model, offers):
    from ftplan.catalog.gpus import load_gpus
    from ftplan.job import Layout
    from ftplan.planner import Infeasible, price_layout

    gpu = load_gpus()["h100-sxm"]
    job = Job(method="lora", seq_len=2048, micro_batch=4, dataset_tokens=50_000_000)
    lay = Layout(8, 1, "fsdp")
    plan = price_layout(model, job, lay, gpu, offers)
    assert not isinstance(plan, Infeasible)
    matching = [o for o in offers if o.gpu == "h100-sxm" and o.gpus_per_instance >= 8]
    assert plan.offer in matching
    assert plan.cost.usd == min(
        price_layout(model, job, lay, gpu, [o]).cost.usd for o in matching)
    assert plan.layout == lay and plan.job.micro_batch == 4
    assert plan.cost.usd_low <= plan.cost.usd <= plan.cost.usd_high
    # nothing sells 16 GPUs per instance; too big a micro-batch does not fit
    assert isinstance(price_layout(model, job, Layout(16, 1, "fsdp"), gpu, offers), Infeasible)
    huge = price_layout(resolve_model("llama-3.1-70b"), Job(dataset_tokens=10**7), Layout(), gpu, offers)
    assert isinstance(huge, Infeasible) and huge.needed_bytes > huge.available_bytes
