"""The runtime in the front ends: `ftplan estimate --gpu` prints and returns the step time, tokens/s,
MFU and their band (with --tokens: hours and cost on the cheapest matching offer); `recommend`
keeps a given micro-batch, strategy and GPU count; the web app answers the same."""

from __future__ import annotations

import json

import pytest

from ftplan import api
from ftplan.catalog.offers import load_offers
from ftplan.cli import main


def cli(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(list(argv))
    return rc, capsys.readouterr().out


def test_estimate_with_gpu_prints_runtime_and_price(capsys):
    rc, out = cli(capsys, "estimate", "llama-3.2-1b", "--method", "lora", "--gpu", "h100-sxm", "--micro-batch", "4",
                  "--tokens", "20M")
    assert rc == 0
    for needle in ("step time", "tokens/s", "MFU", "time ", "cost ", "band of published measurements"):
        assert needle in out, needle
    rc, out = cli(capsys, "estimate", "llama-3.2-1b", "--gpu", "h100-sxm", "--json", "--tokens", "20M")
    doc = json.loads(out)
    r = doc["runtime"]
    lo, hi = r["band"]["step_time_s"]
    assert lo <= r["step_time_s"] <= hi and r["band"]["quantiles"] == [0.1, 0.9]
    c = doc["priced"]["cost"]
    assert c["usd_band"][0] <= c["usd"] <= c["usd_band"][1]
    # the cheapest matching on-demand offer
    h100 = [o for o in load_offers() if o.gpu == "h100-sxm" and o.pricing == "on-demand"]
    cheapest = min(h100, key=lambda o: o.usd_per_instance_hour)
    assert doc["priced"]["offer"]["usd_per_instance_hour"] == pytest.approx(cheapest.usd_per_instance_hour)
    # without --gpu: memory only, as before
    rc, out = cli(capsys, "estimate", "llama-3.2-1b", "--json")
    assert "runtime" not in json.loads(out)


def test_estimate_layout_flags_reach_the_runtime():
    one = api.estimate("llama-3.1-8b", gpu="h100-sxm", method="lora", micro_batch=2)
    eight = api.estimate("llama-3.1-8b", gpu="h100-sxm", method="lora", micro_batch=2, gpus=8, strategy="fsdp")
    assert eight.runtime.tokens_per_s > 5 * one.runtime.tokens_per_s
    assert eight.runtime.tokens_per_step == 8 * one.runtime.tokens_per_step
    two_nodes = api.estimate("llama-3.1-8b", gpu="h100-sxm", method="lora", micro_batch=2, gpus=8, nodes=2,
                             strategy="fsdp")
    assert two_nodes.runtime is not None and any("inter-node network" in n for n in two_nodes.runtime_notes)
    tp = api.estimate("llama-3.1-8b", gpu="h100-sxm", micro_batch=2, gpus=2, tp=2)
    assert tp.runtime.breakdown["tp_comm_s"] > 0


def test_estimate_not_priced_says_why():
    est = api.estimate("llama-3.1-70b", gpu="h100-sxm", tokens="10M")  # 70B full on one GPU: does not fit
    assert est.runtime is not None and est.fits is False
    assert est.priced is not None and est.priced.needed_bytes > est.priced.available_bytes
    assert "not priced" in est.text()


def test_recommend_keeps_given_choices(capsys):
    argv = ["recommend", "llama-3.2-1b", "--method", "lora", "--tokens", "20M", "--json"]
    rc, out = cli(capsys, *argv, "--micro-batch", "2", "--strategy", "fsdp", "--gpus", "4")
    doc = json.loads(out)
    assert rc == 0 and doc["plans"]
    for p in doc["plans"]:
        assert p["job"]["micro_batch"] == 2 and p["layout"]["strategy"] == "fsdp"
        assert p["layout"]["gpus_per_node"] * p["layout"]["nodes"] == 4
    assert any("kept as given" in n for n in doc["notes"])
    rc, out = cli(capsys, *argv)
    free = json.loads(out)
    assert len({p["job"]["micro_batch"] for p in free["plans"]}) > 1 or \
        len({p["layout"]["gpus_per_node"] * p["layout"]["nodes"] for p in free["plans"]}) > 1
    # every plan carries the band
    for p in free["plans"]:
        lo, hi = p["runtime"]["band"]["total_hours"]
        assert lo <= p["runtime"]["total_hours"] <= hi
        assert p["cost"]["usd_band"][0] <= p["cost"]["usd"] <= p["cost"]["usd_band"][1]


def test_recommend_text_states_the_band(capsys):
    rc, out = cli(capsys, "recommend", "llama-3.2-1b", "--method", "lora", "--tokens", "20M", "--top", "2")
    assert rc == 0 and "uncertainty: step times x" in out


def test_web_estimate_and_fixed_micro_batch():
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from ftplan.web import create_app

    client = TestClient(create_app())
    r = client.post("/api/estimate", json={"model": "llama-3.2-1b", "method": "lora", "gpu": "h100-sxm",
                                            "tokens": "20M"})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["runtime"]["band"]["step_time_s"][1] >= doc["runtime"]["step_time_s"] and "cost" in doc["priced"]
    r = client.post("/api/recommend", json={"model": "llama-3.2-1b", "method": "lora", "tokens": "20M",
                                             "micro_batch": 2, "top": 5})
    assert r.status_code == 200, r.text
    assert {p["job"]["micro_batch"] for p in r.json()["plans"]} == {2}
    r = client.post("/api/recommend", json={"model": "llama-3.2-1b", "method": "lora", "tokens": "20M",
                                             "fixed_strategy": "ddp", "fixed_gpus": 2, "top": 5})
    assert r.status_code == 200, r.text
    assert {(p["layout"]["strategy"], p["layout"]["gpus_per_node"] * p["layout"]["nodes"])
            for p in r.json()["plans"]} == {("ddp", 2)}
