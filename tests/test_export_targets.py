"""Planner and export agree: the best plan of a default search exports, and its files load in their
owners' parsers (accelerate, DeepSpeed, SkyPilot, axolotl, LLaMA-Factory: see ``export_checks.py``).

* ``planner.recommend`` over the bundled catalog (on-demand prices, the CLI's default) for
  llama-3.1-70b full / lora / qlora and qwen3-30b-a3b lora: plan 1 renders with the default target
  (accelerate) and with every other target that runs its layout; every file is parsed.
* The rule (``export.targets``): pipeline parallelism is left out of the default ranking with its
  reason, and comes back with ``target=None``; TP runs as accelerate ND-parallel (transformers' TP
  plan) or DeepSpeed AutoTP (dense models only); LLaMA-Factory has no TP; FSDP cannot offload only
  the optimizer.
* Synthetic layouts of a fixed plan: TP (pure and with FSDP2), HSDP across nodes, AutoTP, FSDP2
  offload, QLoRA + FSDP2, spot + job recovery, on every target.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from export_checks import check_bundle, load_owners

from ftplan.catalog.models import resolve_model
from ftplan.catalog.offers import filter_offers, load_offers
from ftplan.errors import ConfigError
from ftplan.export import load_plan_json, plan_document, render_bundle, write_bundle
from ftplan.export.targets import TARGETS, engine, exportable
from ftplan.job import Job, Layout, LoraSpec
from ftplan.planner import recommend

DATA = Path(__file__).parent / "data" / "export"

SEARCHES = {
    "llama-3.1-70b full": ("llama-3.1-70b", "full"),
    "llama-3.1-70b lora": ("llama-3.1-70b", "lora"),
    "llama-3.1-70b qlora": ("llama-3.1-70b", "qlora"),
    "qwen3-30b-a3b lora": ("qwen3-30b-a3b", "lora"),
}


@pytest.fixture(scope="module")
def owners():
    return load_owners()


@pytest.fixture(scope="module")
def offers():
    return filter_offers(load_offers(), pricing=["on-demand"])


def _search(name: str, offers, job_kw=None, **kw):
    ref, method = SEARCHES[name]
    model = resolve_model(ref)
    dropout = 0.0 if model.is_moe else 0.05  # the CLI's default (PEFT refuses dropout on fused experts)
    job = Job(method=method, dataset_tokens=20_000_000, lora=LoraSpec(dropout=dropout), **(job_kw or {}))
    return model, recommend(model, job, offers, **kw)


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_best_plan_exports_and_parses(name, offers, owners, tmp_path, monkeypatch):
    model, ps = _search(name, offers)
    assert ps.plans, ps.infeasible
    docs = [plan_document(model, p) for p in ps.plans]
    for p in ps.plans:  # every ranked plan runs with the default target
        assert exportable(p.layout, p.job, "accelerate", model)[0], p.layout
    plan, others = docs[0], docs[1:]
    rendered = 0
    for target in TARGETS:
        ok, why = exportable(ps.plans[0].layout, ps.plans[0].job, target, model)
        if not ok:
            assert target != "accelerate", why
            continue
        files = render_bundle(plan, alternatives=others, target=target, dataset="data.jsonl")
        out = write_bundle(files, tmp_path / target)
        check_bundle(out, plan, files, owners, monkeypatch, target)
        rendered += 1
    assert rendered >= 3


def test_pipeline_parallel_left_out_with_reason(offers):
    # a job whose states and activations need model parallelism on the smaller GPUs (transformers'
    # loss with full logits, no checkpointing), so the search reaches the tensor/pipeline stage
    heavy = {"seq_len": 2048, "gradient_checkpointing": False, "loss": "hf"}
    model, ps = _search("llama-3.1-70b full", offers, heavy)
    assert not any(p.layout.pp > 1 for p in ps.plans)
    assert any("pipeline parallelism" in n for n in ps.notes)
    _, every = _search("llama-3.1-70b full", offers, heavy, target=None)
    assert any(p.layout.pp > 1 for p in every.plans)
    assert not any("pipeline parallelism" in n for n in every.notes)
    with pytest.raises(ConfigError, match="unknown export target"):
        _search("llama-3.1-70b full", offers, target="megatron")


@pytest.mark.parametrize("layout,method,target,want", [
    (Layout(8, 1, "single", tp=8), "full", "accelerate", "tp"),
    (Layout(8, 2, "zero1", tp=4), "lora", "accelerate", "tp"),
    (Layout(8, 1, "single", tp=8), "full", "deepspeed", "autotp"),
    (Layout(8, 1, "zero1", tp=4), "full", "axolotl", "autotp"),
    (Layout(8, 1, "zero3"), "full", "accelerate", "fsdp"),
    (Layout(8, 1, "zero3"), "full", "deepspeed", "deepspeed"),
    (Layout(8, 1, "zero3", offload_optimizer=True), "full", "accelerate", "deepspeed"),
    (Layout(8, 1, "fsdp", offload_optimizer=True, offload_params=True), "full", "accelerate", "fsdp"),
    (Layout(8, 1, "zero2"), "lora", "llamafactory", "deepspeed"),
    (Layout(8, 1, "ddp"), "qlora", "axolotl", "ddp"),
    (Layout(), "qlora", "llamafactory", "single"),
])
def test_engine(layout, method, target, want):
    assert engine(layout, Job(method=method), target, model=resolve_model("llama-3.1-8b")) == want


@pytest.mark.parametrize("layout,method,model,target,match", [
    (Layout(8, 1, "single", tp=4, pp=2), "full", "llama-3.1-8b", "accelerate", "pipeline parallelism"),
    (Layout(8, 1, "single", tp=8), "qlora", "llama-3.1-8b", "accelerate", "bitsandbytes"),
    (Layout(8, 1, "single", tp=8), "full", "llama-3.1-8b", "llamafactory", "Megatron"),
    (Layout(4, 1, "single", tp=4), "lora", "qwen3-30b-a3b", "deepspeed", "MoE"),
    (Layout(8, 1, "fsdp", offload_optimizer=True), "full", "llama-3.1-8b", "accelerate", "FSDP cannot offload"),
])
def test_not_exportable(layout, method, model, target, match):
    ok, why = exportable(layout, Job(method=method, lora=LoraSpec(dropout=0.0)), target, resolve_model(model))
    assert not ok and match in why


# ---------------------------------------------------------------------------------------------
# synthetic layouts of a fixed plan (llama-3.1-70b LoRA on 8 x H100), every target
# ---------------------------------------------------------------------------------------------
def _variant(layout=None, job=None, offer=None, memory=None) -> tuple[dict, list]:
    plan, others = load_plan_json(DATA / "recommend-70b-lora-h100.json", 1)
    plan = copy.deepcopy(plan)
    for k, v in (("layout", layout), ("job", job), ("offer", offer), ("memory", memory)):
        if v:
            plan[k].update(v)
    return plan, others


VARIANTS = {
    "tp8": {"layout": {"strategy": "single", "tp": 8}},
    "tp4-fsdp-2nodes": {"layout": {"strategy": "zero1", "tp": 4, "nodes": 2}},
    "hsdp-2nodes": {"layout": {"strategy": "zero3", "nodes": 2}},
    "fsdp2-offload": {"layout": {"strategy": "fsdp", "offload_optimizer": True, "offload_params": True}},
    "qlora-fsdp2": {"layout": {"strategy": "zero3"}, "job": {"method": "qlora"}},
    "zero2-spot": {"layout": {"strategy": "zero2"}, "offer": {"pricing": "spot"}},
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_parse(name, target, owners, tmp_path, monkeypatch):
    plan, others = _variant(**VARIANTS[name])
    lo = plan["layout"]
    layout = Layout(lo["gpus_per_node"], lo["nodes"], lo["strategy"], lo["offload_optimizer"], lo["offload_params"],
                    lo["tp"], lo["pp"])
    job = Job(method=plan["job"]["method"])
    ok, why = exportable(layout, job, target, resolve_model("llama-3.1-70b"))
    if not ok:
        with pytest.raises(ConfigError, match="cannot be exported"):
            render_bundle(plan, alternatives=others, target=target)
        return
    files = render_bundle(plan, alternatives=others, target=target, dataset="org/chat-data")
    out = write_bundle(files, tmp_path / "b")
    check_bundle(out, plan, files, owners, monkeypatch, target)
    if name == "hsdp-2nodes" and target in ("accelerate", "llamafactory"):
        assert "parallelism_config_dp_replicate_size: 2" in files["accelerate_config.yaml"]
    if name == "tp8" and target == "accelerate":
        assert "distributed_type: MULTI_GPU" in files["accelerate_config.yaml"]
        assert "ENGINE = 'tp'" in files["train.py"] and "TP_SIZE = 8" in files["train.py"]
    if name == "qlora-fsdp2" and target == "accelerate":
        assert "QUANT_STORAGE = 'bfloat16'" in files["train.py"]
        assert "fsdp_cpu_ram_efficient_loading: false" in files["accelerate_config.yaml"]
    if name == "zero2-spot":
        assert "job_recovery" in files["sky.yaml"] and "sky jobs launch" in files["README.md"]


def test_render_stays_light():
    """Rendering every target imports no torch/transformers/yaml/owners' packages."""
    import subprocess
    import sys

    code = ("import sys, json; from ftplan.export import load_plan_json, render_bundle; "
            f"p, o = load_plan_json({str(DATA / 'recommend-70b-lora-h100.json')!r}, 1); "
            "[render_bundle(p, alternatives=o, target=t) for t in ('accelerate', 'deepspeed', 'axolotl', "
            "'llamafactory')]; "
            "heavy = ('torch', 'transformers', 'yaml', 'sky', 'deepspeed', 'accelerate', 'axolotl', 'llamafactory'); "
            "print(json.dumps([m for m in heavy if m in sys.modules]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(r.stdout) == []


def test_target_names_agree():
    from ftplan.options import EXPORT_TARGETS

    assert EXPORT_TARGETS == TARGETS  # options.py stays below export (no import), so the tuple is repeated


def test_cli_export_prints_files_and_launch(tmp_path, capsys):
    from ftplan.cli import main

    out = tmp_path / "b"
    assert main(["export", "--from-json", str(DATA / "recommend-70b-full-h100.json"), "--plan", "2",
                 "--target", "llamafactory", "--dataset", "my/chat", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}/ for llamafactory: llamafactory.yaml" in text
    assert "accelerate launch --config_file accelerate_config.yaml --machine_rank $NODE_RANK" in text
    assert "-m llamafactory.launcher llamafactory.yaml" in text and "NNODES=8" in text
    assert "sky launch -c ftplan sky.yaml --env DATASET=my/chat" in text
    # never silently over a non-empty directory
    assert main(["export", "--from-json", str(DATA / "recommend-70b-qlora.json"), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (out / "llamafactory.yaml").exists()


def test_every_llamafactory_template_ftplan_writes_is_registered():
    """Each chat template name the LLaMA-Factory export writes (per family, per catalog model) is one
    LLaMA-Factory registers (its data/template.py ``register_template(name=...)``), and every catalog
    model maps to one."""
    import importlib.util
    import re

    from ftplan.catalog.models import load_model_catalog
    from ftplan.export.llamafactory import _BY_NAME, _TEMPLATES, template_for

    spec = importlib.util.find_spec("llamafactory")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llamafactory (tests/validators.txt) is not installed")
    text = (Path(list(spec.submodule_search_locations)[0]) / "data" / "template.py").read_text()
    registered = set(re.findall(r'register_template\(\s*name="([^"]+)"', text))
    assert {"qwen3_5", "kimi_vl", "phi4_mini", "glm4_moe", "gpt_oss"} <= registered
    assert set(_TEMPLATES.values()) | set(_BY_NAME.values()) <= registered
    for name, entry in load_model_catalog().items():
        assert template_for(entry.spec()) in registered, name
