"""The web app's JSON API (FastAPI TestClient): schemas equal the CLI's --json, errors name the
field, bodies are size-limited, a request never makes the server read a path or fetch a model."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

import ftplan.catalog.models as catalog_models  # noqa: E402
from ftplan.cli import main  # noqa: E402
from ftplan.web import create_app  # noqa: E402

SMALL = {"model": "qwen2.5-0.5b", "method": "lora", "tokens": "5M", "seq_len": 1024}


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture(autouse=True)
def no_path_reads_or_hub(monkeypatch):
    """Any attempt to read a config from a path or the hub fails the test."""
    def forbidden(*a, **k):
        raise AssertionError(f"the web app tried to read a config file or fetch from the hub: {a}")

    monkeypatch.setattr(catalog_models, "_read_config_file", forbidden)
    monkeypatch.setattr(catalog_models, "_fetch_hub_config", forbidden)


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


def fields(r) -> set[str]:
    return {d["loc"][-1] for d in r.json()["detail"] if len(d["loc"]) > 1}


# ---------------------------------------------------------------------------------------------
# same documents as the CLI
# ---------------------------------------------------------------------------------------------
def test_catalog_endpoints_equal_cli(client, capsys):
    assert client.get("/api/models").json() == cli_json(capsys, "models")
    assert client.get("/api/gpus").json() == cli_json(capsys, "gpus")
    assert client.get("/api/offers").json() == cli_json(capsys, "offers")
    got = client.get("/api/offers", params={"providers": "aws,lambda", "pricing": "on-demand", "sort": "gpu"})
    assert got.json() == cli_json(capsys, "offers", "--providers", "aws,lambda", "--pricing", "on-demand",
                                  "--sort", "gpu")


def test_recommend_and_compare_equal_cli(client, capsys):
    body = {**SMALL, "deadline": 50, "objective": "time", "top": 5}
    r = client.post("/api/recommend", json=body)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["schema"] == "ftplan.recommend/1" and doc["plans"] and len(doc["plans"]) <= 5
    argv = ["qwen2.5-0.5b", "--method", "lora", "--tokens", "5M", "--seq-len", "1024", "--deadline", "50",
            "--objective", "time"]
    assert _no_seconds(doc) == _no_seconds(cli_json(capsys, "recommend", *argv, "--top", "5"))
    r = client.post("/api/compare", json=body)
    assert r.status_code == 200
    assert _no_seconds(r.json()) == _no_seconds(cli_json(capsys, "compare", *argv))


def test_estimate_and_fit_equal_cli(client, capsys):
    r = client.post("/api/estimate", json={"model": "llama-3.1-8b", "method": "qlora", "gpus": 2,
                                           "strategy": "zero3", "gpu": "h100", "micro_batch": 2})
    assert r.status_code == 200, r.text
    assert r.json() == cli_json(capsys, "estimate", "llama-3.1-8b", "--method", "qlora", "--gpus", "2",
                                "--strategy", "zero3", "--gpu", "h100", "--micro-batch", "2")
    r = client.post("/api/fit", json={"model": "qwen2.5-0.5b", "gpu": ["l4", "h100-sxm"], "seq_len": 1024,
                                      "gradient_checkpointing": True})
    assert r.status_code == 200, r.text
    assert r.json() == cli_json(capsys, "fit", "qwen2.5-0.5b", "--gpu", "l4", "--gpu", "h100-sxm",
                                "--seq-len", "1024", "--gc")


def test_tokens_forms_normalize_and_hit_the_cache(client):
    a = client.post("/api/recommend", json={**SMALL, "tokens": "5M", "providers": "RunPod, aws"})
    b = client.post("/api/recommend", json={**SMALL, "tokens": 5_000_000, "providers": ["aws", "runpod"]})
    assert a.status_code == b.status_code == 200
    assert b.headers["x-ftplan-cache"] == "hit"
    assert a.content == b.content


def test_pasted_config_is_data(client):
    cfg = dict(catalog_models.get_model("qwen2.5-0.5b").config)
    cfg["auto_map"] = {"AutoModelForCausalLM": "evil.Model"}  # never imported or run
    cfg["trust_remote_code"] = True
    r = client.post("/api/estimate", json={"config": cfg, "config_name": "mine", "method": "lora"})
    assert r.status_code == 200, r.text
    ref = client.post("/api/estimate", json={"model": "qwen2.5-0.5b", "method": "lora"}).json()
    assert r.json()["model"]["name"] == "mine"
    assert r.json()["params_total"] == ref["params_total"]
    assert r.json()["per_gpu"] == ref["per_gpu"]


# ---------------------------------------------------------------------------------------------
# errors: 422 naming the field and the fix, 413, no path reads
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("body, field, words", [
    ({"model": "llama-70b", "tokens": "1M"}, "model", "did you mean"),
    ({"tokens": "1M"}, "model", "model"),
    ({"model": "qwen2.5-0.5b", "config": {"model_type": "llama"}}, "config", "not both"),
    ({"model": "qwen2.5-0.5b"}, "tokens", "tokens=50M"),
    ({"model": "qwen2.5-0.5b", "tokens": "lots"}, "tokens", "50M"),
    ({"model": "qwen2.5-0.5b", "tokens": "1M", "method": "fp8"}, "method", "'lora'"),
    ({"model": "qwen2.5-0.5b", "tokens": "1M", "method": "lora", "lora_targets": "qkv"}, "lora_targets", "q_proj"),
    ({"model": "qwen2.5-0.5b", "tokens": "1M", "gpus_filter": "h999"}, "gpus_filter", "h100"),
    ({"model": "qwen2.5-0.5b", "tokens": "1M", "pricing": "cheap"}, "pricing", "spot"),
    ({"model": "qwen2.5-0.5b", "tokens": "1M", "margin": 1.5}, "margin", "less than 1"),
    ({"model": "qwen2.5-0.5b", "tokens": "1M", "seq_lenn": 4096}, "seq_lenn", "not permitted"),
    ({"config": {"model_type": "gpt_neox"}, "tokens": "1M"}, "config", "supported"),
    ({"config": {"model_type": "llama", "hidden_size": "big"}, "tokens": "1M"}, "config", ""),
    ({"model": "some-org/some-model", "tokens": "1M"}, "model", "never fetches"),
])
def test_recommend_422_names_the_field(client, body, field, words):
    r = client.post("/api/recommend", json=body)
    assert r.status_code == 422, r.text
    assert field in fields(r), r.json()
    assert words.lower() in r.json()["message"].lower()
    assert r.json()["message"].startswith(field + ": ") or f"; {field}: " in r.json()["message"]


def test_estimate_and_fit_422(client):
    r = client.post("/api/estimate", json={"model": "llama-3.1-8b", "gpus": 4, "tp": 3})
    assert r.status_code == 422 and fields(r) == {"tp"}
    r = client.post("/api/estimate", json={"model": "llama-3.1-8b", "gpu": "h1000"})
    assert r.status_code == 422 and fields(r) == {"gpu"} and "h100" in r.json()["message"]
    r = client.post("/api/fit", json={"model": "llama-3.1-8b"})
    assert r.status_code == 422 and fields(r) == {"gpu"}
    r = client.post("/api/fit", json={"model": "llama-3.1-8b", "gpu": "h100,b2000"})
    assert r.status_code == 422 and fields(r) == {"gpu"} and "b200" in r.json()["message"]
    r = client.post("/api/recommend", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422


@pytest.mark.parametrize("ref", ["/etc/passwd", "../x", "../../etc/hosts", "~/.ssh/id_rsa", "./config.json",
                                 "config.json", "C:\\Windows\\win.ini", "file:///etc/passwd"])
def test_model_names_are_never_paths(client, ref):
    r = client.post("/api/estimate", json={"model": ref})
    assert r.status_code in (404, 422)
    assert fields(r) == {"model"}
    assert "root:" not in r.text


def test_an_existing_config_path_is_not_read(client, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(catalog_models.get_model("qwen2.5-0.5b").config))
    for ref in (str(path), str(tmp_path)):
        r = client.post("/api/estimate", json={"model": ref})
        assert r.status_code == 422 and fields(r) == {"model"}


def test_body_limit_413(client):
    big = {"config": {"model_type": "llama", "pad": "x" * 300_000}}
    r = client.post("/api/estimate", json=big)
    assert r.status_code == 413
    assert "256 KiB" in r.json()["message"]

    def chunks():  # no content-length: the limit holds while streaming
        yield b'{"config": {"pad": "'
        for _ in range(40):
            yield b"x" * 10_000
        yield b'"}}'

    r = client.post("/api/estimate", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    small = create_app(max_body_bytes=1000)
    with TestClient(small) as c:
        assert c.post("/api/estimate", json={"model": "qwen2.5-0.5b", "config_name": "y" * 2000}).status_code == 413
        assert c.post("/api/estimate", json={"model": "qwen2.5-0.5b"}).status_code == 200


# ---------------------------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------------------------
def test_export_zip_with_a_render_bundle(client, monkeypatch):
    import ftplan.export as export_mod

    seen = {}

    def fake(plan_doc, *, alternatives=(), model_ref=None, dataset=None, **kwargs):
        seen.update(plan=plan_doc, alternatives=alternatives, model_ref=model_ref, dataset=dataset, **kwargs)
        return export_mod.Rendered({"README.md": "# run it\n", "configs/accelerate.yaml": "num_processes: 1\n"},
                                   kwargs["target"], "single", "python train.py", (), None)

    monkeypatch.setattr(export_mod, "render", fake, raising=False)
    r = client.post("/api/export", json={**SMALL, "plan_index": 1, "dataset": "my/data"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/zip"
    assert r.headers["content-disposition"].startswith("attachment; filename=\"ftplan-qwen2.5-0.5b-")
    z = zipfile.ZipFile(io.BytesIO(r.content))
    assert sorted(z.namelist()) == ["README.md", "configs/accelerate.yaml", "plan.json"]
    rec = client.post("/api/recommend", json={**SMALL, "top": 5}).json()
    plan = json.loads(z.read("plan.json"))
    assert plan == seen["plan"]
    assert plan["schema"] == "ftplan.plan/1" and plan["model"] == rec["model"]
    assert {k: v for k, v in plan.items() if k not in ("schema", "model")} == rec["plans"][1]
    assert seen["model_ref"] == "Qwen/Qwen2.5-0.5B" and seen["dataset"] == "my/data"
    assert seen["target"] == "accelerate"  # the search's target (the page's default)
    assert list(seen["alternatives"])[:4] == [rec["plans"][0], *rec["plans"][2:5]]
    r = client.post("/api/export", json={"config": catalog_models.get_model("qwen2.5-0.5b").config,
                                         "tokens": "5M"})
    assert r.status_code == 422 and fields(r) == {"config"}
    r = client.post("/api/export", json={**SMALL, "plan_index": 10**5})
    assert r.status_code == 422 and fields(r) == {"plan_index"}

    monkeypatch.setattr(export_mod, "render", lambda *a, **k: export_mod.Rendered(
        {"../evil": "x"}, "accelerate", "single", "python train.py", (), None))
    r = client.post("/api/export", json=SMALL)  # refused, never zipped: a bug is a JSON 500, not a crash
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert "internal error: ValueError" in r.json()["message"]


def test_export_with_the_real_render_bundle(client):
    r = client.post("/api/export", json={**SMALL, "dataset": "tatsu-lab/alpaca"})
    assert r.status_code == 200, r.text
    z = zipfile.ZipFile(io.BytesIO(r.content))
    names = z.namelist()
    assert "plan.json" in names and len(names) > 2 and all(not n.startswith(("/", "..")) for n in names)
    assert z.testzip() is None
    # the other targets: the same plan as axolotl / LLaMA-Factory files
    for target, name in (("axolotl", "axolotl.yaml"), ("llamafactory", "llamafactory.yaml")):
        r = client.post("/api/export", json={**SMALL, "export_target": target})
        assert r.status_code == 200, r.text
        assert name in zipfile.ZipFile(io.BytesIO(r.content)).namelist()
        assert target in r.headers["content-disposition"]
    r = client.post("/api/export", json={**SMALL, "export_target": "megatron"})
    assert r.status_code == 422 and fields(r) == {"export_target"}
    # tensor parallelism exports (transformers' TP plan); pipeline parallelism is ranked only with
    # target=any and then refused -> 422 on plan_index with the reason
    job = {"model": "llama-3.1-70b", "method": "full", "tokens": "20M", "seq_len": 4096, "gpus_filter": ["b200"],
           "max_gpus": 8, "top": 50}
    plans = client.post("/api/recommend", json=job).json()["plans"]
    assert plans and not any(p["layout"]["pp"] > 1 for p in plans)
    tp = [i for i, p in enumerate(plans) if p["layout"]["tp"] > 1]
    assert tp, "the B200 search for a full 70B ranks a tensor-parallel plan"
    assert client.post("/api/export", json={**job, "plan_index": tp[0]}).status_code == 200
    every = client.post("/api/recommend", json={**job, "target": "any"}).json()["plans"]
    pp = [i for i, p in enumerate(every) if p["layout"]["pp"] > 1]
    assert pp
    r = client.post("/api/export", json={**job, "target": "any", "plan_index": pp[0]})
    assert r.status_code == 422 and fields(r) == {"plan_index"}
    assert "pipeline parallelism" in r.json()["message"]


def test_page_docs_and_openapi_are_offline(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for path in ("/static/app.js", "/static/style.css"):
        assert client.get(path).status_code == 200
    spec = client.get("/openapi.json").json()
    for p in ("/api/models", "/api/gpus", "/api/offers", "/api/estimate", "/api/recommend", "/api/compare",
              "/api/fit", "/api/export"):
        assert p in spec["paths"], p
    props = spec["components"]["schemas"]["SearchRequest"]["properties"]
    assert {"model", "config", "method", "seq_len", "lora_r", "quant_type", "deadline", "budget", "providers",
            "gpus_filter", "pricing", "objective"} <= set(props)
    docs = client.get("/docs")
    assert docs.status_code == 200 and "/api/recommend" in docs.text
    assert "<script" not in docs.text and "cdn" not in docs.text.lower()
    assert client.get("/redoc").status_code == 404
    import re
    from pathlib import Path

    import ftplan.web

    static = Path(ftplan.web.__file__).with_name("static")
    for f in static.iterdir():
        urls = set(re.findall(r"(?:https?:)?//[A-Za-z0-9.-]+\.[a-z]{2,}[^\s\"')]*", f.read_text()))
        assert urls <= {"http://www.w3.org/2000/svg"}, (f.name, urls)  # a namespace, not a request


def test_import_loads_nothing_and_serve_needs_the_extra(capsys, monkeypatch):
    code = ("import sys, ftplan.web; assert 'fastapi' not in sys.modules; ftplan.web.create_app(); "
            "assert 'ftplan.catalog.models' not in sys.modules and 'ftplan.planner' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    monkeypatch.setitem(sys.modules, "fastapi", None)
    assert main(["serve", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'ftplan[web]'" in err


def test_moe_lora_dropout_defaults_like_the_cli(client):
    r = client.post("/api/estimate", json={"model": "mixtral-8x7b", "method": "lora"})
    assert r.status_code == 200 and r.json()["job"]["lora"]["dropout"] == 0.0
    r = client.post("/api/estimate", json={"model": "mixtral-8x7b", "method": "lora", "lora_dropout": 0.1})
    assert r.status_code == 422 and "lora_dropout" in r.text


def test_options_endpoint_gives_the_page_its_defaults(client):
    """The page holds no copied defaults: it reads GET /api/options; every option its form uses is
    there, with the schema's defaults and choices."""
    import re
    from pathlib import Path

    import ftplan.web
    from ftplan.api import options_schema

    r = client.get("/api/options")
    assert r.status_code == 200 and r.json() == options_schema()
    names = {o["name"]: o for group in r.json()["groups"].values() for o in group}
    js = Path(ftplan.web.__file__).with_name("static").joinpath("app.js").read_text()
    form = re.search(r"const FORM_OPTIONS = \[(.*?)\];", js, re.S).group(1)
    used = re.findall(r'"([a-z_]+)"', form)
    assert used and set(used) <= set(names)
    assert names["seq_len"]["default"] == 1024 and names["method"]["choices"] == ["full", "lora", "qlora"]
    assert names["tokens"]["example"] and names["lora_dropout"]["default"] is None  # auto
    # no option default is written into the page itself
    html = Path(ftplan.web.__file__).with_name("static").joinpath("index.html").read_text()
    assert 'value="1024"' not in html and 'value="all-linear"' not in html
