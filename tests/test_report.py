"""The JSON documents (report.py): their fields are the documented ones (docs/json-schemas.md),
a job's keys come from the options schema, and documents read back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ftplan
from ftplan.export.bundle import plan_from_json
from ftplan.options import job_from_dict, layout_from_dict

DOCS = (Path(__file__).resolve().parents[1] / "docs" / "json-schemas.md").read_text()


def _section(schema: str) -> str:
    m = re.search(rf"^## `{re.escape(schema)}`.*?(?=^## |\Z)", DOCS, re.S | re.M)
    assert m, f"docs/json-schemas.md has no section for {schema}"
    return m.group(0)


def _documented(keys, text: str, where: str) -> None:
    # (every document has ``schema``: said once at the top of the file)
    missing = [k for k in keys if k != "schema" and not re.search(rf"\b{re.escape(k)}\b", text)]
    assert not missing, f"{where}: fields not described in docs/json-schemas.md: {missing}"


@pytest.fixture(scope="module")
def rec():
    return ftplan.recommend("qwen2.5-0.5b", method="lora", tokens="5M", seq_len=1024, top=3)


def test_recommend_and_plan_fields_are_documented(rec):
    doc = rec.to_dict()
    sec = _section("ftplan.recommend/1")
    _documented(doc, sec, "recommend")
    plan = doc["plans"][0]
    _documented(plan, sec, "recommend plan")
    for key in ("offer", "memory", "runtime", "cost"):
        _documented(plan[key], sec, f"recommend plan.{key}")
    _documented(doc["search"], sec, "recommend search")
    _documented(doc["infeasible"][0] if doc["infeasible"] else {}, sec, "why-not")
    cmp = ftplan.compare("qwen2.5-0.5b", method="lora", tokens="5M", seq_len=1024).to_dict()
    _documented(set(cmp) - set(doc), _section("ftplan.compare/1"), "compare")


def test_estimate_fit_and_catalog_fields_are_documented():
    est = ftplan.estimate("llama-3.1-8b", method="qlora", gpu="h100").to_dict()
    sec = _section("ftplan.estimate/1")
    _documented(est, sec, "estimate")
    _documented(est["per_gpu"], sec, "estimate per_gpu")
    fit = ftplan.fit("qwen2.5-0.5b", gpu="l4").to_dict()
    sec = _section("ftplan.fit/1")
    _documented(fit, sec, "fit")
    _documented(fit["results"][0], sec, "fit results")
    _documented(ftplan.models().to_dict()["models"][0], _section("ftplan.models/1"), "models")
    _documented(ftplan.gpus().to_dict()["gpus"][0], _section("ftplan.gpus/1"), "gpus")
    offers = ftplan.offers().to_dict()
    _documented(offers, _section("ftplan.offers/1"), "offers")
    _documented(offers["offers"][0], _section("ftplan.offers/1"), "offers")


def test_job_and_layout_read_back(rec):
    doc = rec.to_dict()
    plan = rec.plans.plans[0]
    d = doc["plans"][0]
    # a plan's job has no dataset size (its tokens are runtime.total_tokens)
    assert job_from_dict(d["job"]) == plan.job.with_(dataset_tokens=None)
    assert layout_from_dict(d["layout"]) == plan.layout
    assert job_from_dict(doc["job"]) == rec.job  # with dataset_tokens and epochs
    assert "dataset_tokens" in doc["job"] and "dataset_tokens" not in d["job"]
    pdoc, others = plan_from_json(doc, 2)
    assert pdoc["schema"] == "ftplan.plan/1" and pdoc["job"] == doc["plans"][1]["job"] and others


def test_estimate_document_job_is_the_schema():
    lora = ftplan.estimate("llama-3.1-8b", method="lora").to_dict()["job"]
    full = ftplan.estimate("llama-3.1-8b").to_dict()["job"]
    assert "lora" in lora and "quant" not in lora and "lora" not in full
    assert set(lora) - set(full) == {"lora"} and "dataset_tokens" not in full
