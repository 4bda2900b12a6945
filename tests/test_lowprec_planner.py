"""Precision as a searched dimension: `precision=auto` / `precisions=...` in recommend and compare.

Each GPU type runs the precisions it supports (FP8 from sm89 on, NVFP4 GEMMs on sm100 only, a
weight-only NVFP4 base anywhere), plans carry their precision in ``plan.job``, and compare reports
what each precision contributes per GPU (tokens/s per GPU over the same GPU's base-precision plan).
"""

from __future__ import annotations

import pytest

from ftplan import api
from ftplan.errors import ConfigError
from ftplan.job import Job
from ftplan.lowprec import auto_precisions


def test_auto_precisions_per_method():
    assert auto_precisions("full") == ("bf16-mixed", "fp8-tensorwise", "nvfp4-te")
    assert auto_precisions("lora") == ("bf16-mixed", "fp8-tensorwise", "nvfp4-weight-only")
    assert auto_precisions("qlora") == ("bf16-mixed",)


@pytest.fixture(scope="module")
def lora70_auto():
    return api.compare("llama-3.1-70b", method="lora", tokens="100M", precision="auto",
                       gpus_filter="a100-80gb-sxm,h100-sxm,h200,b200", gradient_checkpointing=True)


def test_compare_searches_precisions_per_gpu(lora70_auto):
    ps = lora70_auto.plans
    got = {(p.gpu.name, p.job.precision_label) for p in ps.best_per_gpu_precision()}
    assert ("b200", "fp8-tensorwise") in got and ("b200", "nvfp4-weight-only") in got
    assert ("h100-sxm", "fp8-tensorwise") in got and ("h200", "bf16-mixed") in got
    assert not any(g == "a100-80gb-sxm" and p.startswith("fp8") for g, p in got)  # no FP8 on Ampere
    assert all(p.job.precision == "bf16-mixed" for p in ps.plans)  # the recipes' base precision
    doc = lora70_auto.to_dict()
    rows = doc["per_gpu_precision"]
    assert {r["precision"] for r in rows} == {"bf16-mixed", "fp8-tensorwise", "nvfp4-weight-only"}
    for r in rows:
        assert r["plan"]["job"]["low_precision"] == (None if r["precision"] == "bf16-mixed" else r["precision"])
        if r["precision"] == "bf16-mixed":
            assert r["speedup_vs_base"] == pytest.approx(1.0)


def test_explicit_precision_list_and_refusals():
    rec = api.recommend("llama-3.1-8b", method="full", tokens="20M", precisions="bf16-mixed,fp8,nvfp4",
                        gpus_filter="a100-80gb-sxm,h100-sxm,b200", gradient_checkpointing=True)
    labels = {(p.gpu.name, p.job.precision_label) for p in rec.plans.plans}
    assert ("b200", "nvfp4-te") in labels and ("h100-sxm", "fp8-tensorwise") in labels
    assert ("h100-sxm", "nvfp4-te") not in labels  # Hopper has no FP4 tensor cores
    assert {p for g, p in labels if g == "a100-80gb-sxm"} == {"bf16-mixed"}


def test_unsupported_precisions_are_named_not_searched():
    rec = api.recommend("llama-3.1-8b", method="qlora", tokens="20M", precisions="auto,fp8",
                        gpus_filter="h100-sxm", gradient_checkpointing=True)
    assert {p.job.precision_label for p in rec.plans.plans} == {"bf16-mixed"}
    assert any("precision fp8 not searched" in n for n in rec.plans.notes)


def test_auto_is_only_for_searches():
    with pytest.raises(ConfigError, match="precision=auto"):
        api.estimate("llama-3.1-8b", precision="auto")
    assert Job(precision="auto").low_precision is None


@pytest.mark.parametrize("fn", ["measure", "train"])
def test_measure_and_train_refuse_low_precision(fn, tmp_path):
    """`ftplan measure` / `ftplan train` run the base precisions: an FP8 plan is refused with a
    pointer to the export (accelerate launch sets FP8 up), never silently trained in bf16."""
    with pytest.raises(ConfigError, match="base precisions only"):
        if fn == "measure":
            api.measure("llama-3.1-8b", precision="fp8", steps=1)
        else:
            api.train(str(tmp_path), "data.jsonl", str(tmp_path / "out"), precision="fp8")
