"""Issue 19 through the command line: --dataset / --tokenizer / --batching, spot risk with
--pricing any, host RAM rejection, --ep; text and --json (in process, through ftplan.cli.main)."""

from __future__ import annotations

import json

from ftplan.cli import main


def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _data(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"text": "word " * n}) + "\n" for n in [10] * 50 + [300] * 5))
    return f


def test_recommend_pricing_any_shows_spot_expected_cost_and_host(capsys):
    rc, out, _ = _run(capsys, "recommend", "qwen2.5-7b", "--method", "lora", "--tokens", "100M", "--pricing", "any",
                      "--gpus-filter", "h100-sxm,h200", "--json", "--top", "50")
    assert rc == 0
    doc = json.loads(out)
    spot = [p for p in doc["plans"] if p["offer"]["pricing"] == "spot"]
    od = [p for p in doc["plans"] if p["offer"]["pricing"] == "on-demand"]
    assert spot and od
    for p in spot:
        s = p["spot"]
        assert s["expected_usd"] > p["cost"]["usd"] * 0.999 and p["expected_usd"] == s["expected_usd"]
        assert s["rate_source"] and s["expected_preemptions"] >= 0
    assert all(p["spot"] is None and p["expected_usd"] == p["cost"]["usd"] for p in od)
    assert all(p["host"]["ram_bytes"] > 0 and p["host"]["disk_bytes"] > 0 for p in doc["plans"])
    keys = [p["expected_usd"] for p in doc["plans"]]
    assert keys == sorted(keys)
    rc, text, _ = _run(capsys, "recommend", "qwen2.5-7b", "--method", "lora", "--tokens", "100M", "--pricing", "any",
                       "--gpus-filter", "h100-sxm")
    assert "host GiB/disk GB" in text and "spot E[$]" in text


def test_offer_without_the_host_ram_is_rejected_with_why(tmp_path, capsys):
    offers = tmp_path / "o.csv"
    offers.write_text(
        "provider,sku,gpu,gpus_per_instance,usd_per_gpu_hour,pricing,as_of,source,host_ram_gib,host_source\n"
        "Small,small-8x,h100-sxm,8,2.0,on-demand,2026-01-01,test,64,test\n")
    rc, out, _ = _run(capsys, "recommend", "llama-3.1-70b", "--tokens", "10M", "--offers", str(offers),
                      "--no-bundled-offers")
    assert rc == 3
    assert "h100-sxm: Small small-8x: needs" in out and "GiB host RAM per node" in out
    assert "the small-8x instance has 64 GiB" in out


def test_dataset_on_estimate_recommend_and_fit(tmp_path, capsys):
    data = _data(tmp_path)
    rc, out, _ = _run(capsys, "estimate", "qwen2.5-0.5b", "--method", "lora", "--seq-len", "4096", "--micro-batch", "4",
                      "--dataset", str(data), "--json")
    assert rc == 0
    doc = json.loads(out)
    b = doc["dataset"]["batches"]
    assert doc["dataset"]["samples"] == 55 and b["batching"] == "longest"
    # the memory is at the largest batch: 4 rows of the longest sample, not --seq-len
    assert doc["job"]["seq_len"] == b["peak_seq_len"] == doc["dataset"]["max"] < 4096
    rc, out, _ = _run(capsys, "recommend", "qwen2.5-0.5b", "--method", "lora", "--seq-len", "1024",
                      "--dataset", str(data), "--batching", "packed", "--gpus-filter", "l4", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["dataset"]["samples"] == 55 and doc["plans"]
    assert any(n.startswith("dataset: memory at the largest batch") for n in doc["plans"][0]["notes"])
    rc, out, _ = _run(capsys, "fit", "qwen2.5-0.5b", "--method", "lora", "--gpu", "l4", "--dataset", str(data), "--json")
    assert rc == 0
    cut = {c["keep_pct"]: c["seq_len"] for c in json.loads(out)["results"][0]["seq_len_cutoffs"]}
    assert cut[90.0] < cut[100.0]
    rc, _, err = _run(capsys, "estimate", "qwen2.5-0.5b", "--dataset", str(data), "--batching", "packd")
    assert rc == 2 and err.startswith("ftplan: error:") and "batching" in err
    rc, _, err = _run(capsys, "estimate", "qwen2.5-0.5b", "--tokenizer", str(data))
    assert rc == 2 and "--dataset" in err


def test_moe_plans_include_expert_parallel_layouts(capsys):
    # `--target any`: no export target sets up expert parallelism, so the default search leaves it out
    rc, out, _ = _run(capsys, "recommend", "qwen3-30b-a3b", "--tokens", "50M", "--gpus-filter", "h200", "--json",
                      "--top", "20", "--target", "any")
    assert rc == 0
    plans = json.loads(out)["plans"]
    assert any(p["layout"]["ep"] > 1 and "+ep" in p["strategy_label"] for p in plans)
    rc, out, _ = _run(capsys, "recommend", "qwen3-30b-a3b", "--tokens", "50M", "--gpus-filter", "h200", "--json",
                      "--top", "20")
    doc = json.loads(out)
    assert rc == 0 and all(p["layout"]["ep"] == 1 for p in doc["plans"])
    assert any("expert parallelism (ep > 1)" in n and "ep=1" in n for n in doc["notes"]), doc["notes"]
    rc, out, _ = _run(capsys, "estimate", "qwen3-30b-a3b", "--gpus", "8", "--strategy", "fsdp", "--ep", "8", "--json")
    assert rc == 0 and json.loads(out)["layout"]["ep"] == 8
    rc, _, err = _run(capsys, "estimate", "qwen3-30b-a3b", "--gpus", "8", "--strategy", "fsdp", "--ep", "3")
    assert rc == 2 and "must divide the 128 experts" in err
