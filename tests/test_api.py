"""ftplan's Python API (``ftplan.api``, re-exported by ``ftplan``): typed results equal to the CLI's
--json documents, options by name, every input problem at once with its field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import ftplan
from ftplan import api
from ftplan.cli import main
from ftplan.cli.options import RENDERER
from ftplan.errors import ConfigError, FtplanError, NotFoundError, Problem

PUBLIC = {
    "__version__", "estimate", "recommend", "compare", "fit", "export_bundle", "Estimate", "Recommendation",
    "Comparison", "FitReport", "Bundle", "models", "gpus", "offers", "options_schema", "ModelList", "GpuList",
    "OfferList", "resolve_model", "model_from_config", "Job", "Layout", "LoraSpec", "QuantSpec", "ModelSpec",
    "FtplanError", "ConfigError", "CatalogError", "NotFoundError", "InfeasibleError", "MeasurementError", "Problem",
}


def cli_json(capsys, *argv) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _no_seconds(doc):
    if isinstance(doc, dict):
        return {k: _no_seconds(v) for k, v in doc.items() if k != "seconds"}
    if isinstance(doc, list):
        return [_no_seconds(x) for x in doc]
    return doc


def test_public_api():
    assert set(ftplan.__all__) == PUBLIC and len(ftplan.__all__) == len(PUBLIC)
    for name in ftplan.__all__:
        assert getattr(ftplan, name) is not None, name
    assert set(api.__all__) >= PUBLIC - {"__version__", "Job", "Layout", "LoraSpec", "QuantSpec", "ModelSpec",
                                         "FtplanError", "ConfigError", "CatalogError", "NotFoundError",
                                         "InfeasibleError", "MeasurementError", "Problem"}
    for name in api.__all__:
        assert hasattr(api, name), name
    # the subpackages keep their names (functions of the same name stay in ftplan.api)
    import importlib

    for mod in ("ftplan.measure", "ftplan.train", "ftplan.options", "ftplan.export"):
        importlib.import_module(mod)
        assert getattr(ftplan, mod.split(".")[1]).__name__ == mod


def test_import_is_light():
    code = ("import sys, ftplan, ftplan.api, ftplan.options;"
            "import ftplan.catalog.gpus as g, ftplan.catalog.offers as o, ftplan.catalog.models as m;"
            "heavy = [x for x in ('torch', 'transformers', 'fastapi', 'pydantic', 'numpy') if x in sys.modules];"
            "assert not heavy, heavy;"
            "assert 'ftplan.planner' not in sys.modules and 'ftplan.memory' not in sys.modules;"
            "print(g._bundled.cache_info().currsize, o._bundled.cache_info().currsize,"
            "      m.load_model_catalog.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "0", "0"]  # no data file loaded


# ---------------------------------------------------------------------------------------------
# results equal the CLI's documents
# ---------------------------------------------------------------------------------------------
def test_estimate(capsys):
    est = ftplan.estimate("llama-3.1-8b", method="qlora", gpus=2, strategy="zero3", gpu="h100", micro_batch=2)
    assert isinstance(est, ftplan.Estimate) and est.layout.strategy == "zero3" and est.fits is True
    assert est.to_dict() == cli_json(capsys, "estimate", "llama-3.1-8b", "--method", "qlora", "--gpus", "2",
                                     "--strategy", "zero3", "--gpu", "h100", "--micro-batch", "2")
    # a Job and a Layout instead of options; options given with them override their fields
    job = ftplan.Job(method="lora", seq_len=4096)
    a = ftplan.estimate("llama-3.1-8b", job, ftplan.Layout())
    b = ftplan.estimate("llama-3.1-8b", job, seq_len=1024)
    assert a.job == job and b.job.seq_len == 1024 and b.job.method == "lora"
    assert b.memory.peak_allocated_bytes < a.memory.peak_allocated_bytes
    # a ModelSpec and a config.json dict are model references too
    spec = ftplan.resolve_model("qwen2.5-0.5b")
    from ftplan.catalog.models import get_model

    cfg = dict(get_model("qwen2.5-0.5b").config)
    assert ftplan.estimate(spec).memory == ftplan.estimate(cfg).memory
    assert "peak allocated" in a.text()


def test_recommend_and_compare(capsys):
    kw = dict(method="lora", tokens="5M", seq_len=1024, deadline=50, objective="time")
    rec = ftplan.recommend("qwen2.5-0.5b", top=5, **kw)
    assert rec.best is rec.plans.plans[0] and len(rec.to_dict()["plans"]) <= 5
    argv = ["qwen2.5-0.5b", "--method", "lora", "--tokens", "5M", "--seq-len", "1024", "--deadline", "50",
            "--objective", "time"]
    assert _no_seconds(rec.to_dict()) == _no_seconds(cli_json(capsys, "recommend", *argv, "--top", "5"))
    cmp = ftplan.compare("qwen2.5-0.5b", **kw)
    assert _no_seconds(cmp.to_dict()) == _no_seconds(cli_json(capsys, "compare", *argv))
    assert len({p.gpu.name for p in cmp.per_gpu}) == len(cmp.per_gpu)


def test_recommend_over_given_offers():
    from ftplan.catalog.offers import load_offers

    mine = [o for o in load_offers() if o.gpu == "h100-sxm" and o.pricing == "on-demand"][:2]
    rec = ftplan.recommend("qwen2.5-0.5b", method="lora", tokens="1M", offer_list=mine)
    assert rec.plans.plans and {p.offer for p in rec.plans.plans} <= set(mine)


def test_fit(capsys):
    rep = ftplan.fit("qwen2.5-0.5b", gpu=["l4", "h100-sxm"], seq_len=1024, gradient_checkpointing=True)
    assert [r.gpu for r in rep.results] == ["l4", "h100-sxm"]
    assert rep.to_dict() == cli_json(capsys, "fit", "qwen2.5-0.5b", "--gpu", "l4", "--gpu", "h100-sxm",
                                     "--seq-len", "1024", "--gc")
    assert [r.gpu for r in ftplan.fit("qwen2.5-0.5b", gpu="l4, h100").results] == ["l4", "h100-sxm"]


def test_export_bundle(tmp_path):
    rec = ftplan.recommend("qwen2.5-0.5b", method="lora", tokens="5M", seq_len=1024)
    b = ftplan.export_bundle(rec, 1, dataset="tatsu-lab/alpaca")
    assert {"accelerate_config.yaml", "train.py", "README.md", "plan.json"} <= set(b.files)
    assert b.plan["schema"] == "ftplan.plan/1" and b.plan["offer"] == rec.to_dict()["plans"][0]["offer"]
    out = b.write(tmp_path / "bundle")
    assert sorted(p.name for p in out.iterdir()) == sorted(b.files)
    # the same plan from the saved document
    again = ftplan.export_bundle(rec.to_dict(), 1, dataset="tatsu-lab/alpaca")
    assert again.plan == json.loads(b.files["plan.json"]) or again.plan["offer"] == b.plan["offer"]
    with pytest.raises(ConfigError) as e:
        ftplan.export_bundle(rec, 10**6)
    assert e.value.field == "plan" and "--plan 1.." in e.value.one_line(RENDERER)


def test_catalogs():
    assert ftplan.models().to_dict()["schema"] == "ftplan.models/1"
    assert "h100-sxm" in ftplan.gpus().gpus
    offers = ftplan.offers(pricing="spot", sort="gpu")
    assert offers.offers and all(o.pricing == "spot" for o in offers.offers)
    assert [o.gpu for o in offers.offers] == sorted(o.gpu for o in offers.offers)
    assert ftplan.options_schema()["schema"] == "ftplan.options/1"


# ---------------------------------------------------------------------------------------------
# structured errors: every problem at once, with its field; the CLI says flags, the library fields
# ---------------------------------------------------------------------------------------------
def test_all_problems_at_once_with_fields():
    with pytest.raises(ConfigError) as e:
        ftplan.estimate("llama-3.1-8b", method="lora", micro_batch=0, seq_len="x", lora_r=0, gpus=3, tp=3,
                        strategy="zero9", gpu="h1000")
    fields = [p.field for p in e.value.problems]
    assert set(fields) == {"seq_len", "gpu"}  # types and names first: the job cannot be built yet
    with pytest.raises(ConfigError) as e:
        ftplan.estimate("llama-3.1-8b", method="lora", micro_batch=0, lora_r=0, gpus=3, tp=3, strategy="zero9")
    assert {p.field for p in e.value.problems} == {"micro_batch", "lora_r", "tp", "strategy"}
    assert all(isinstance(p, Problem) for p in e.value.problems)


def test_unknown_option_names_the_option():
    with pytest.raises(ConfigError) as e:
        ftplan.estimate("llama-3.1-8b", seq_lenn=4096)
    assert e.value.field == "seq_lenn" and "seq_len" in e.value.one_line()
    with pytest.raises(ConfigError) as e:
        ftplan.fit("llama-3.1-8b", gpu="h100", tp=2)  # a layout option where only job options go
    assert e.value.field == "tp"


def test_messages_name_fields_and_the_cli_renders_flags(capsys):
    with pytest.raises(ConfigError) as e:
        ftplan.estimate("mixtral-8x7b", method="lora", lora_dropout=0.1)
    err = e.value
    assert err.field == "lora_dropout"
    assert "lora_dropout=0" in err.one_line() and "--" not in err.one_line()
    assert "--lora-dropout 0" in err.one_line(RENDERER) and "--lora-targets q_proj" in err.one_line(RENDERER)
    assert str(err) == err.one_line()
    with pytest.raises(NotFoundError) as e:
        ftplan.estimate("llama-70b")
    assert e.value.field == "model" and "did you mean" in str(e.value)
    assert main(["recommend", "qwen2.5-0.5b"]) == 2
    assert capsys.readouterr().err == ("ftplan: error: the planner needs the dataset size "
                                       "(pass --tokens, e.g. --tokens 50M)\n")


def test_error_helpers():
    e = FtplanError("bad `seq_len=0`", "use `ftplan models`")
    assert e.one_line() == "bad seq_len=0 (use 'ftplan models')"
    assert e.one_line(RENDERER) == "bad --seq-len 0 (use 'ftplan models')"
    at = ConfigError("x").at("tokens")
    assert type(at) is ConfigError and at.field == "tokens"
    both = ConfigError(problems=[Problem("a", "one", "fix a"), Problem(None, "two")])
    assert both.one_line() == "one (fix a); two" and both.message == "one (fix a); two" and both.field == "a"
