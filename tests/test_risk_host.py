"""Spot preemption risk (``ftplan.risk``), host RAM / disk and checkpoint sizes (``ftplan.host``).

* The expected completion time of Daly's model is held against an independent Monte Carlo
  simulation of exponential reclaims with checkpoint / restart; the expected spot cost exceeds
  the spot price x failure-free hours and converges to it as the rate goes to 0; the optimum
  interval is a minimum.
* An offer whose instance lacks the host RAM is rejected by ``recommend`` with the reason; host
  RAM takes the memory model's offload bytes as they are.
* Checkpoint sizes are held against the bytes real ``save_pretrained`` (safetensors) and the
  optimizer's state dict hold for tiny models on CPU (full and LoRA, tied embeddings).
"""

from __future__ import annotations

import json
import math
import random
import struct
from types import SimpleNamespace

import pytest

from ftplan.catalog.hostdata import preemption_rate_for, preemption_rates
from ftplan.catalog.models import resolve_model
from ftplan.catalog.offers import load_offers
from ftplan.errors import ConfigError
from ftplan.host import check_offer, checkpoint_size, host_requirements
from ftplan.job import Job, Layout
from ftplan.memory import estimate_memory
from ftplan.planner import recommend
from ftplan.risk import daly_interval_hours, expected_wall_hours, spot_risk


def _runtime(hours, startup=0.2):
    return SimpleNamespace(hours=hours, startup_hours=startup)


def _offer(provider="GCP", gpu="h100-sxm", price=20.0, g=None):
    return SimpleNamespace(provider=provider, sku="x", gpu=gpu, usd_per_instance_hour=price,
                           billing_granularity_s=g, pricing="spot")


def _simulate(work, tau, delta, restart, mtbf, rng, runs=4000):
    """Monte Carlo of the process Daly's formula describes: segments of tau work + delta
    checkpoint must finish before the next reclaim; a reclaim loses the segment and costs a
    restart (itself interruptible)."""
    total = 0.0
    for _ in range(runs):
        t = 0.0
        done = 0.0
        while done < work - 1e-12:
            seg = min(tau, work - done) + delta
            while True:
                x = rng.expovariate(1.0 / mtbf)
                if x >= seg:
                    t += seg
                    break
                t += x
                # restart, itself exposed to reclaims
                while True:
                    y = rng.expovariate(1.0 / mtbf)
                    if y >= restart:
                        t += restart
                        break
                    t += y
            done += min(tau, work - done)
        total += t
    return total / runs


def test_daly_expected_time_matches_a_simulation():
    rng = random.Random(7)
    work, delta, restart, mtbf = 20.0, 0.05, 0.2, 8.0
    tau = daly_interval_hours(delta, mtbf)
    sim = _simulate(work, tau, delta, restart, mtbf, rng)
    model = expected_wall_hours(work, tau, delta, restart, mtbf)
    # the formula treats the last, shorter segment as a full one: slightly conservative
    assert sim <= model * 1.02 and model / sim - 1 < 0.05
    # the optimum is a minimum
    for f in (0.5, 2.0):
        assert expected_wall_hours(work, tau * f, delta, restart, mtbf) > model


def test_spot_cost_exceeds_the_uninterrupted_run_and_converges():
    ck = SimpleNamespace(total_bytes=200 * 2**30, sharded=False)
    rt = _runtime(30.0)
    lay = Layout(8, 2, "zero3")
    prev = None
    for rate in (0.05, 0.01, 1e-3, 1e-4, 1e-6, 1e-9):
        r = spot_risk(rt, _offer(), lay, ck, rate_per_hour=rate)
        base = 2 * 20.0 * (30.0 + 0.2)  # 2 instances x price x failure-free hours
        assert r.expected_usd > base and r.uninterrupted_usd == pytest.approx(base)
        assert r.job_rate_per_hour == pytest.approx(2 * rate)
        if prev is not None:
            assert r.expected_usd < prev  # monotone in the rate
        prev = r.expected_usd
    assert prev == pytest.approx(base, rel=1e-3)
    z = spot_risk(rt, _offer(), lay, ck, rate_per_hour=0.0)
    assert z.expected_usd == pytest.approx(base) and z.expected_preemptions == 0 and z.interval_hours is None
    # a fixed interval adds its checkpoint overhead even without reclaims
    fixed = spot_risk(rt, _offer(), lay, ck, rate_per_hour=0.0, checkpoint_interval_s=1800)
    assert fixed.expected_hours == pytest.approx(0.2 + 30 * (1 + fixed.checkpoint_write_s / 1800))
    # a sharded checkpoint is written by every node in parallel: faster, cheaper
    sh = spot_risk(rt, _offer(), lay, SimpleNamespace(total_bytes=ck.total_bytes, sharded=True), rate_per_hour=0.01)
    assert sh.checkpoint_write_s == pytest.approx(spot_risk(rt, _offer(), lay, ck, rate_per_hour=0.01).checkpoint_write_s / 2)
    with pytest.raises(ConfigError):
        spot_risk(rt, _offer(), lay, ck, rate_per_hour=1.5)
    with pytest.raises(ConfigError):
        spot_risk(rt, _offer(), lay, ck, checkpoint_interval_s=0)


def test_preemption_catalog_lookup():
    rows = preemption_rates()
    assert all(r.source and r.basis for r in rows)
    aws = preemption_rate_for("AWS", "p5.48xlarge", "h100-sxm")
    assert aws.sku == "p5.48xlarge" and not aws.assumed
    assert aws.rate_per_hour == pytest.approx(-math.log(0.8) / 730, rel=1e-2)
    gcp = preemption_rate_for("GCP", "a3-highgpu-8g", "h100-sxm")
    assert gcp.rate_per_hour == pytest.approx(-math.log(0.85) / 24, rel=1e-2)
    assert preemption_rate_for("Nowhere", None, "h100-sxm").assumed


def test_recommend_ranks_spot_on_expected_cost_with_risk():
    model = resolve_model("llama-3.1-8b")
    job = Job(method="lora", seq_len=2048, dataset_tokens=200_000_000)
    ps = recommend(model, job, load_offers(), pricing=["on-demand", "spot"], gpus=["h100-sxm"])
    spot = [p for p in ps.plans if p.offer.pricing == "spot"]
    od = [p for p in ps.plans if p.offer.pricing == "on-demand"]
    assert spot and od
    assert all(p.risk is not None and p.expected_usd > p.usd for p in spot)
    assert all(p.risk is None and p.expected_usd == p.usd for p in od)
    assert all(p.host is not None and p.host.ram_bytes > 0 for p in ps.plans)
    keys = [p.expected_usd for p in ps.plans]
    assert keys == sorted(keys)
    # a user rate changes the ranking input
    hi = recommend(model, job, load_offers(), pricing="spot", gpus=["h100-sxm"], preemption_rate=0.2)
    assert min(p.expected_usd for p in hi.plans) > min(p.expected_usd for p in spot)


def _small_ram_offers(tmp_path, ram_gib):
    rows = [o for o in load_offers() if o.provider == "AWS" and o.sku == "p5.48xlarge" and o.pricing == "on-demand"]
    o = rows[0]
    head = ("provider,sku,gpu,gpus_per_instance,usd_per_gpu_hour,pricing,region,inter_node_network,inter_node_gbps,"
            "billing_granularity_s,as_of,source,notes,host_ram_gib,local_disk_gb,host_source")
    line = (f"TestCloud,tiny-host-8x,{o.gpu},8,{o.usd_per_gpu_hour},on-demand,,,0,1,{o.as_of},test,,"
            f"{ram_gib},,test figure")
    p = tmp_path / "offers.csv"
    p.write_text(head + "\n" + line + "\n")
    return load_offers(p, include_bundled=False)


def test_offer_lacking_host_ram_is_rejected_with_why(tmp_path):
    model = resolve_model("llama-3.1-70b")
    job = Job(method="full", seq_len=2048, dataset_tokens=10_000_000)
    offers = _small_ram_offers(tmp_path, 64)
    ps = recommend(model, job, offers)
    assert not ps.plans
    why = next(i for i in ps.infeasible if i.gpu == offers[0].gpu)
    assert "host RAM" in why.reason and "tiny-host-8x instance has 64 GiB" in why.reason
    # with enough RAM the same offer plans
    ok = recommend(model, job, _small_ram_offers(tmp_path, 4096))
    assert ok.plans and all(p.host.ram_gib <= 4096 for p in ok.plans)


def test_host_ram_takes_offload_bytes_and_loading_rules():
    model = resolve_model("llama-3.1-70b")
    job = Job(method="full", seq_len=2048, gradient_checkpointing=True)
    off = Layout(8, 1, "zero3", offload_optimizer=True, offload_params=True)
    mem = estimate_memory(model, job, off)
    req = host_requirements(model, job, off, mem)
    assert req.ram_breakdown["offload"] == 8 * mem.host_bytes  # the memory model's figure, per GPU
    assert req.efficient_loading and req.ram_breakdown["model_loading"] == model.params.total * 4
    ddp = Layout(8, 1, "ddp")
    small = resolve_model("llama-3.1-8b")
    r2 = host_requirements(small, job, ddp, estimate_memory(small, job, ddp))
    assert not r2.efficient_loading and r2.ram_breakdown["model_loading"] == 8 * small.params.total * 4
    assert r2.ram_phase == "loading"
    q = Job(method="qlora", seq_len=2048)
    r3 = host_requirements(model, q, Layout(), estimate_memory(model, q))
    assert r3.ram_breakdown["model_loading"] <= 5_000_000_000
    lo = checkpoint_size(model, Job(method="lora"), Layout())
    full = checkpoint_size(model, job, off)
    assert lo.kind == "adapter" and lo.total_bytes < full.total_bytes / 100
    assert full.sharded and full.writers == 8
    assert check_offer(req, SimpleNamespace(host_ram_gib=None, sku="x")) is None


def _safetensors_tensor_bytes(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")


@pytest.mark.torch
@pytest.mark.parametrize("family,method", [("llama", "full"), ("qwen2", "full"), ("llama", "lora")])
def test_checkpoint_size_matches_saved_files(tmp_path, family, method):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import ftplan.measure.torchref as TR
    from ftplan.model import model_from_config

    cfg = TR.TINY_CONFIGS[family]
    model = TR.build_model(cfg, dtype="fp32")
    job = Job(method=method, precision="fp32", lora=Job().lora.__class__(r=8, alpha=16, dropout=0.0))
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=False)
    ids = torch.randint(0, cfg["vocab_size"], (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    model.save_pretrained(tmp_path)
    name = "adapter_model.safetensors" if method == "lora" else "model.safetensors"
    saved_w = _safetensors_tensor_bytes(tmp_path / name)
    saved_opt = sum(t.numel() * t.element_size() for s in opt.state_dict()["state"].values()
                    for t in s.values() if torch.is_tensor(t))
    ck = checkpoint_size(model_from_config(cfg), job)
    assert ck.weights_bytes == saved_w
    assert ck.optimizer_bytes == saved_opt
