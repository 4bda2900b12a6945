"""Non-finite and absurd numbers never reach the memory/runtime/cost arithmetic (issue 16, item 1).

``validate_job`` and the planner's constraints refuse NaN, infinities, 400-digit integers and
wrong types with one ``ConfigError``; whatever they accept yields finite predictions, and the
training script never holds ``inf``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftplan.catalog.gpus import get_gpu
from ftplan.catalog.models import get_model
from ftplan.catalog.offers import load_offers
from ftplan.errors import ConfigError
from ftplan.export.script import render_train_script
from ftplan.job import Job, Layout, LoraSpec, validate_job
from ftplan.memory import estimate_memory
from ftplan.planner import fit, recommend
from ftplan.runtime import estimate_runtime

MODEL = get_model("qwen2.5-0.5b").spec()
INF, NAN = float("inf"), float("nan")
FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("change, words", [
    ({"epochs": INF}, "epochs must be a finite number"),
    ({"epochs": NAN}, "epochs must be a finite number"),
    ({"epochs": 1e400}, "epochs must be a finite number"),
    ({"epochs": 1e9}, "epochs must be in (0, 10000]"),
    ({"dataset_tokens": INF}, "dataset tokens must be an integer"),
    ({"dataset_tokens": 5e7}, "dataset tokens must be an integer"),
    ({"dataset_tokens": 10**400}, "got an integer of about 400 digits"),
    ({"dataset_tokens": 0}, "dataset tokens must be > 0"),
    ({"seq_len": 10**30}, "sequence length"),
    ({"micro_batch": "8"}, "micro-batch must be an integer"),
    ({"micro_batch": True}, "micro-batch must be an integer"),
    ({"grad_accum": 2.5}, "gradient accumulation must be an integer"),
    ({"method": ["lora"]}, "method must be text"),
    ({"gradient_checkpointing": "yes"}, "gradient checkpointing must be true or false"),
    ({"method": "lora", "lora": LoraSpec(dropout=NAN)}, "LoRA dropout must be a finite number"),
    ({"method": "lora", "lora": LoraSpec(alpha=INF)}, "LoRA alpha must be an integer (got inf)"),
    ({"method": "lora", "lora": LoraSpec(r=10**12)}, "LoRA rank"),
    ({"method": "lora", "lora": LoraSpec(target_modules=("q_proj\n",))}, "lora targets must be a list of names"),
])
def test_bad_job_numbers_are_config_errors(change, words):
    with pytest.raises(ConfigError) as e:
        validate_job(MODEL, Job(**change))
    assert words in e.value.one_line()


@pytest.mark.parametrize("layout, words", [
    (Layout(gpus_per_node=10**20), "GPUs per node"),
    (Layout(gpus_per_node=8, nodes=2**40, strategy="ddp"), "nodes"),
    (Layout(tp=1.5), "tensor-parallel degree must be an integer"),
    (Layout(strategy=None), "strategy"),
    (Layout(gpus_per_node=2, strategy="zero3", offload_params="true"), "offload params must be true or false"),
])
def test_bad_layouts_are_config_errors(layout, words):
    with pytest.raises(ConfigError) as e:
        validate_job(MODEL, Job(), layout)
    assert words in e.value.one_line()


@pytest.mark.parametrize("kwargs, words", [
    ({"deadline_hours": INF}, "deadline must be a finite number"),
    ({"deadline_hours": NAN}, "deadline must be a finite number"),
    ({"budget_usd": INF}, "budget must be a finite number"),
    ({"budget_usd": -1.0}, "budget must be > 0"),
    ({"budget_usd": 1e300}, "budget 1e+300 is implausibly large"),
    ({"safety_margin": NAN}, "safety margin must be a finite number"),
    ({"safety_margin": 1.0}, "safety margin must be in [0, 1)"),
    ({"max_gpus": INF}, "max GPUs must be an integer"),
    ({"max_gpus": 10**100}, "max GPUs"),
    ({"global_batch": 2.0}, "global batch must be an integer"),
])
def test_recommend_constraints_refuse_non_finite(kwargs, words):
    offers = load_offers()[:5]
    with pytest.raises(ConfigError) as e:
        recommend(MODEL, Job(dataset_tokens=10**6), offers, **kwargs)
    assert words in e.value.one_line()


def test_fit_refuses_non_finite_margin():
    with pytest.raises(ConfigError, match="safety margin"):
        fit(MODEL, Job(), get_gpu("h100-sxm"), safety_margin=INF)


def test_train_script_never_holds_inf():
    with pytest.raises(ConfigError, match="epochs"):
        render_train_script(MODEL, Job(epochs=INF), Layout(), model_ref="x")
    text = render_train_script(MODEL, Job(epochs=1e4), Layout(), model_ref="x")
    assert "inf" not in text.replace("info", "").replace("inference", "").split("# ---- the plan")[1].split("# -")[0]


_num = st.one_of(st.integers(-3, 2**20), st.integers(-10**30, 10**30), st.floats(allow_nan=True, allow_infinity=True),
                 st.sampled_from([None, True, "8", [], 1e400]))


@FUZZ
@given(mb=_num, seq=_num, ga=_num, epochs=_num, tokens=_num, r=_num, alpha=_num, dropout=_num,
       gpn=_num, nodes=_num, method=st.sampled_from(["full", "lora", "qlora", "x", 3]),
       strategy=st.sampled_from(["single", "ddp", "zero3", "fsdp", "zero9"]))
def test_fuzz_job_is_rejected_or_finite(mb, seq, ga, epochs, tokens, r, alpha, dropout, gpn, nodes, method, strategy):
    job = Job(method=method, micro_batch=mb, seq_len=seq, grad_accum=ga, epochs=epochs, dataset_tokens=tokens,
              lora=LoraSpec(r=r, alpha=alpha, dropout=dropout))
    layout = Layout(gpus_per_node=gpn, nodes=nodes, strategy=strategy)
    try:
        validate_job(MODEL, job, layout)
    except ConfigError as e:
        assert "\n" not in e.one_line()
        return
    mem = estimate_memory(MODEL, job, layout)
    assert mem.device_total_bytes > 0 and math.isfinite(float(mem.device_total_bytes))
    if layout.world_size <= 8:
        rt = estimate_runtime(MODEL, job, layout, get_gpu("h100-sxm"))
        assert math.isfinite(rt.step_time_s) and rt.step_time_s > 0
        if rt.total_hours is not None:
            assert math.isfinite(rt.total_hours)
