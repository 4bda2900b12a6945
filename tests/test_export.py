"""`ftplan export`: every file of a bundle is read back by its owner's own parser.

* accelerate_config.yaml: accelerate's ``load_config_from_file`` and the launcher's own argument
  validation (``_validate_launch_command``) and environment (DeepSpeed: ``DeepSpeedPlugin`` built from
  it, which loads ``ds_config.json``; FSDP: the ``FSDP_*`` variables the processes get);
* ds_config.json: transformers' ``HfTrainerDeepSpeedConfig`` fills the ``auto`` values from the
  training script's own numbers (no mismatch), then DeepSpeed's ``DeepSpeedConfig`` parses it;
* sky.yaml: ``sky.Task.from_yaml`` (resources, num_nodes, accelerators, spot);
* train.py: ``compile``; README.md / plan.json: content checks.

Golden files (tests/golden/export/<case>/) pin the rendered text for fixed plan documents
(tests/data/export/*.json, saved from ``ftplan recommend --json``), so prices in the bundled catalog
can change without touching them. Regenerate with ``FTPLAN_UPDATE_GOLDEN=1 pytest tests/test_export.py``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from pathlib import Path

import pytest

from ftplan.cli import main
from ftplan.errors import ConfigError
from ftplan.export import load_plan_json, plan_from_json, render_bundle, write_bundle

from export_checks import check_bundle, load_owners

HERE = Path(__file__).parent
DATA = HERE / "data" / "export"
GOLDEN = HERE / "golden" / "export"
UPDATE = os.environ.get("FTPLAN_UPDATE_GOLDEN") == "1"
HAS_SCRIPT = importlib.util.find_spec("ftplan.export.script") is not None
#: train.py belongs to the script renderer (its own tests); goldens pin the files of the export
GOLDEN_SKIP = {"train.py"}

# name -> (fixture, plan number, render_bundle keywords)
CASES = {
    "qlora-single": ("recommend-70b-qlora.json", 1, {"dataset": "trl-lib/Capybara"}),
    "lora-fsdp": ("recommend-70b-lora-h100.json", 1, {"zero3_backend": "fsdp"}),
    "full-zero3-offload": ("recommend-70b-full-h100.json", 1, {}),
    "full-zero3-multinode": ("recommend-70b-full-h100.json", 2, {"model_ref": "/models/llama-3.1-70b"}),
    # tensor parallelism (the best plan of 'ftplan recommend llama-3.1-70b --method full --tokens 20M')
    "full-tp8": ("recommend-70b-full.json", 1, {"dataset": "data.jsonl"}),
    "full-tp8-autotp": ("recommend-70b-full.json", 1, {"target": "deepspeed"}),
    # the other targets
    "axolotl-lora-fsdp2": ("recommend-70b-lora-h100.json", 1, {"target": "axolotl", "dataset": "trl-lib/Capybara"}),
    "axolotl-full-offload": ("recommend-70b-full-h100.json", 1, {"target": "axolotl"}),
    "llamafactory-qlora": ("recommend-70b-qlora.json", 1, {"target": "llamafactory", "dataset": "data.jsonl"}),
    "llamafactory-full-multinode": ("recommend-70b-full-h100.json", 2, {"target": "llamafactory"}),
}


def _case(name: str):
    fixture, index, kw = CASES[name]
    plan, others = load_plan_json(DATA / fixture, index)
    return plan, others, kw


def _render(name: str) -> dict[str, str]:
    plan, others, kw = _case(name)
    return render_bundle(plan, alternatives=others, **kw)


# ---------------------------------------------------------------------------------------------
# owners' parsers (tests/export_checks.py; imported once per module, each skips when missing)
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def owners():
    return load_owners()


# ---------------------------------------------------------------------------------------------
# fixed plans: owners' parsers + goldens
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_bundle_parses(name, tmp_path, owners, monkeypatch):
    plan, _, kw = _case(name)
    files = _render(name)
    out = write_bundle(files, tmp_path / "bundle")
    check_bundle(out, plan, files, owners, monkeypatch, kw.get("target", "accelerate"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    files = _render(name)
    assert ("train.py" in files) == (HAS_SCRIPT and _case(name)[2].get("target", "accelerate") in ("accelerate",
                                                                                                  "deepspeed"))
    gdir = GOLDEN / name
    want = {n: t for n, t in files.items() if n not in GOLDEN_SKIP}
    if UPDATE:
        gdir.mkdir(parents=True, exist_ok=True)
        for old in gdir.iterdir():
            if old.name not in want:
                old.unlink()
        for n, t in want.items():
            (gdir / n).write_text(t, encoding="utf-8")
        return
    if not gdir.is_dir():
        pytest.fail(f"no golden files for {name}: run FTPLAN_UPDATE_GOLDEN=1 pytest tests/test_export.py")
    assert sorted(p.name for p in gdir.iterdir()) == sorted(want)
    for n, t in want.items():
        assert t == (gdir / n).read_text(encoding="utf-8"), (
            f"{name}/{n} differs from its golden file (FTPLAN_UPDATE_GOLDEN=1 to accept the new output)")


def test_render_is_deterministic_and_pure():
    a = _render("full-zero3-multinode")
    b = _render("full-zero3-multinode")
    assert a == b
    import subprocess
    import sys

    code = ("import sys, json; from ftplan.export import load_plan_json, render_bundle; "
            f"p, o = load_plan_json({str(DATA / 'recommend-70b-lora-h100.json')!r}, 1); "
            "render_bundle(p, alternatives=o, zero3_backend='fsdp'); "
            "heavy = ('torch', 'transformers', 'yaml', 'sky', 'deepspeed', 'accelerate'); "
            "bad = [m for m in heavy if m in sys.modules]; "
            "print(json.dumps(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(r.stdout) == []


def test_fixture_specifics():
    q = _render("qlora-single")
    assert "ds_config.json" not in q and "job_recovery" not in q["sky.yaml"]
    assert 'distributed_type: "NO"' in q["accelerate_config.yaml"]
    assert 'DATASET: trl-lib/Capybara' in q["sky.yaml"]
    lf = _render("lora-fsdp")
    assert "distributed_type: FSDP" in lf["accelerate_config.yaml"]
    # the chosen offer is on CoreWeave (no SkyPilot cloud): asked on any cloud, after named clouds
    assert "CoreWeave" in lf["README.md"] and "any cloud" in lf["README.md"]
    # offload runs DeepSpeed (DeepSpeedCPUAdam, what the planner's offload runtime assumes)
    off = json.loads(_render("full-zero3-offload")["ds_config.json"])
    assert off["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert off["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert off["optimizer"]["type"] == "AdamW"
    assert "memory:" in _render("full-zero3-offload")["sky.yaml"]
    mn = _render("full-zero3-multinode")
    assert "num_machines: 8" in mn["accelerate_config.yaml"] and "num_processes: 64" in mn["accelerate_config.yaml"]
    # FSDP2 over all 64 GPUs: sharded over one node the 70B states do not fit an H100 (no HSDP)
    assert "fsdp_version: 2" in mn["accelerate_config.yaml"] and "parallelism_config" not in mn["accelerate_config.yaml"]
    assert "not HSDP" in mn["README.md"]
    assert "infra: aws" in mn["sky.yaml"] and "SKYPILOT_NODE_RANK" in mn["sky.yaml"]
    assert 'MODEL: /models/llama-3.1-70b' in mn["sky.yaml"]
    if HAS_SCRIPT:
        assert "'/models/llama-3.1-70b'" in mn["train.py"]


# ---------------------------------------------------------------------------------------------
# other layouts (synthetic variants of a fixed plan)
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def no_bnb_on_mi300x(monkeypatch):
    """Every bundled GPU runs bitsandbytes and flash attention today: pretend MI300X does not."""
    from dataclasses import replace

    import ftplan.catalog.gpus as gpus

    real = gpus.get_gpu

    def get_gpu(name, catalog=None):
        g = real(name, catalog)
        if g.name == "mi300x":
            g = replace(g, supports_bitsandbytes=False, supports_flash_attention=False)
        return g

    monkeypatch.setattr(gpus, "get_gpu", get_gpu)


def _variant(**layout) -> dict:
    plan, _, _ = _case("lora-fsdp")
    plan = copy.deepcopy(plan)
    plan["layout"].update(layout)
    return plan


@pytest.mark.parametrize("layout,backend,kind", [
    ({"strategy": "ddp"}, "deepspeed", "MULTI_GPU"),
    ({"strategy": "zero1"}, "deepspeed", "DEEPSPEED"),
    ({"strategy": "zero2", "offload_optimizer": True}, "deepspeed", "DEEPSPEED"),
    ({"strategy": "zero3"}, "deepspeed", "DEEPSPEED"),
    ({"strategy": "fsdp"}, "deepspeed", "FSDP"),
    ({"strategy": "zero3", "offload_optimizer": True, "offload_params": True}, "fsdp", "FSDP"),
    ({"strategy": "ddp", "nodes": 2}, "deepspeed", "MULTI_GPU"),
])
def test_layout_variants_parse(layout, backend, kind, tmp_path, owners, monkeypatch):
    plan = _variant(**layout)
    files = render_bundle(plan, zero3_backend=backend)
    assert f"distributed_type: {kind}" in files["accelerate_config.yaml"]
    out = write_bundle(files, tmp_path / "b")
    check_bundle(out, plan, files, owners, monkeypatch)


@pytest.mark.parametrize("change,match", [
    ({"layout": {"pp": 2, "strategy": "zero1"}}, "pipeline parallelism"),
    ({"layout": {"tp": 8, "strategy": "single"}, "job": {"method": "qlora"}}, "bitsandbytes 4-bit"),
    ({"layout": {"strategy": "zero3", "offload_optimizer": True}, "_backend": "fsdp"}, "FSDP cannot offload only"),
    ({"job": {"optimizer": "adamw_8bit"}, "layout": {"strategy": "zero3", "offload_optimizer": True}},
     "AdamW on the CPU"),
    ({"job": {"method": "fp8"}}, "not modelled"),
    ({"offer": {"gpu": "mi300x"}, "job": {"method": "qlora"}}, "bitsandbytes"),
    ({"offer": {"gpu": "mi300x"}, "job": {"attn_impl": "flash"}}, "flash attention"),
    ({"job": {"micro_batch": "many"}}, "bad 'job'"),
])
def test_render_refuses(change, match, no_bnb_on_mi300x):
    plan = copy.deepcopy(_case("lora-fsdp")[0])
    backend = change.pop("_backend", "deepspeed")
    for k, v in change.items():
        plan[k].update(v)
    with pytest.raises(ConfigError, match=match):
        render_bundle(plan, zero3_backend=backend)


def test_plan_from_json_documents():
    doc = json.loads((DATA / "recommend-70b-full-h100.json").read_text())
    plan, others = plan_from_json(doc, 2)
    assert plan["schema"] == "ftplan.plan/1" and plan["model"]["name"] == "llama-3.1-70b"
    assert plan["layout"]["nodes"] == 8
    assert all("schema" not in o for o in others) and len(others) >= len(doc["plans"]) - 1
    # a plan document round-trips, and a compare document works too
    again, _ = plan_from_json(json.loads(json.dumps(plan)), 1)
    assert again == plan
    cmp_doc = {**doc, "schema": "ftplan.compare/1", "per_gpu": doc["plans"][:1]}
    assert plan_from_json(cmp_doc, 1)[0]["offer"] == doc["plans"][0]["offer"]


# ---------------------------------------------------------------------------------------------
# live: the cheapest plans of a real search, through the CLI
# ---------------------------------------------------------------------------------------------
_LIVE = {
    "qlora": ["--method", "qlora"],
    "lora-fsdp": ["--method", "lora", "--gpus-filter", "h100-sxm", "--zero3-backend", "fsdp"],
    # ZeRO-3 with optimizer offload fits 70B full on one 8 x H100 node in ~1.8 h: a 1 h deadline
    # asks for the multi-node plans
    "full-multinode": ["--method", "full", "--gpus-filter", "h100-sxm", "--deadline", "1"],
}


@pytest.mark.parametrize("name", sorted(_LIVE))
def test_cli_export_live(name, tmp_path, owners, monkeypatch, capsys):
    out = tmp_path / "bundle"
    argv = ["export", "llama-3.1-70b", "--tokens", "20M", "--seq-len", "4096", *_LIVE[name], "--out", str(out),
            "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "ftplan.export/1" and Path(doc["out"]) == out
    plan = doc["plan"]
    lo = plan["layout"]
    if name == "qlora":
        assert lo["gpus_per_node"] * lo["nodes"] == 1
    elif name == "lora-fsdp":
        assert lo["strategy"] == "zero3" and lo["gpus_per_node"] > 1
        assert "distributed_type: FSDP" in (out / "accelerate_config.yaml").read_text()
    else:  # zero3 across nodes runs as FSDP2 by default (over all GPUs: one node cannot hold a 70B's shards)
        assert lo["strategy"] == "zero3" and lo["nodes"] > 1
        assert not (out / "ds_config.json").exists()
        assert "fsdp_version: 2" in (out / "accelerate_config.yaml").read_text()
        assert doc["target"] == "accelerate" and doc["launch"]["engine"] == "fsdp"
        assert "--machine_rank $NODE_RANK" in doc["launch"]["command"]
    files = {p.name: p.read_text() for p in out.iterdir()}
    check_bundle(out, plan, files, owners, monkeypatch)


def test_cli_export_from_json_and_plan_n(tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["export", "--from-json", str(DATA / "recommend-70b-full-h100.json"), "--plan", "2",
                 "--out", str(out)]) == 0
    assert "exported plan 2" in capsys.readouterr().out
    assert json.loads((out / "plan.json").read_text())["layout"]["nodes"] == 8
    # --force replaces a non-empty directory
    assert main(["export", "--from-json", str(DATA / "recommend-70b-qlora.json"), "--out", str(out),
                 "--force"]) == 0
    assert not (out / "ds_config.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["b"]  # no temporary directories left behind


# ---------------------------------------------------------------------------------------------
# bad input: one line on stderr, exit 2, nothing written
# ---------------------------------------------------------------------------------------------
def _write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _edited(tmp_path: Path, **plan_changes) -> str:
    doc = json.loads((DATA / "recommend-70b-qlora.json").read_text())
    for k, v in plan_changes.items():
        doc["plans"][0][k].update(v)
    return _write(tmp_path, "edited.json", json.dumps(doc))


BAD = {
    "plan out of range (search)": (lambda t: ["llama-3.1-70b", "--method", "qlora", "--tokens", "20M",
                                               "--plan", "999"], "out of range"),
    "plan out of range (json)": (lambda t: ["--from-json", str(DATA / "recommend-70b-qlora.json"), "--plan", "0"],
                                 "out of range"),
    "not json": (lambda t: ["--from-json", _write(t, "x.json", "{nope")], "not JSON"),
    "foreign json": (lambda t: ["--from-json", _write(t, "x.json", '{"schema": "ftplan.fit/1"}')], "schema"),
    "json without schema": (lambda t: ["--from-json", _write(t, "x.json", "[1, 2]")], "not a JSON object"),
    "missing file": (lambda t: ["--from-json", str(t / "nope.json")], "no such file"),
    "method the hardware cannot run": (lambda t: ["--from-json", _edited(t, offer={"gpu": "mi300x"})],
                                       "cannot run on mi300x"),
    "no feasible plan": (lambda t: ["llama-3.1-70b", "--method", "full", "--tokens", "20M", "--budget", "0.01"],
                         "no feasible plan"),
    "torchtune loss": (lambda t: ["--from-json", _edited(t, job={"loss": "torchtune", "precision": "bf16"})],
                       "torchtune's chunked-output cross-entropy"),
    "pipeline-parallel plan": (lambda t: ["--from-json", _edited(
        t, layout={"gpus_per_node": 2, "pp": 2}, offer={"gpus_per_instance": 2})], "pipeline parallelism"),
    "unknown model in json": (lambda t: ["--from-json", _write(t, "m.json", json.dumps(
        {**json.loads((DATA / "recommend-70b-qlora.json").read_text()),
         "model": {"name": "no-such-model", "hf_id": None}}))], "cannot find the plan's model"),
    "model and json": (lambda t: ["llama-3.1-70b", "--from-json", str(DATA / "recommend-70b-qlora.json")],
                       "not both"),
    "nothing": (lambda t: [], "nothing to export"),
    "bad backend": (lambda t: ["--from-json", str(DATA / "recommend-70b-qlora.json"), "--zero3-backend", "x"],
                    "zero3-backend"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_cli_bad_input(case, tmp_path, capsys, no_bnb_on_mi300x):
    make, match = BAD[case]
    out = tmp_path / "bundle"
    rc = main(["export", *make(tmp_path), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("ftplan: error: ") and match in err, err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bundle")]


def test_cli_refuses_non_empty_out(tmp_path, capsys):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    rc = main(["export", "--from-json", str(DATA / "recommend-70b-qlora.json"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "not empty" in err and "--force" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    # an existing empty directory is fine
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", "--from-json", str(DATA / "recommend-70b-qlora.json"), "--out", str(empty)]) == 0
    assert (empty / "plan.json").exists()


def test_cli_refuses_current_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "mine.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    rc = main(["export", "--from-json", str(DATA / "recommend-70b-qlora.json"), "--out", ".", "--force"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "current directory" in err
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_write_bundle_is_all_or_nothing(tmp_path, monkeypatch):
    files = _render("qlora-single")
    with pytest.raises(ConfigError, match="bad bundle path"):
        write_bundle({**files, "../escape.txt": "x"}, tmp_path / "b")
    assert list(tmp_path.iterdir()) == []
    real = Path.write_text
    calls = []

    def failing(self, *a, **k):
        calls.append(self.name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", failing)
    with pytest.raises(ConfigError, match="No space left"):
        write_bundle(files, tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# the SkyPilot name table
# ---------------------------------------------------------------------------------------------
def test_skypilot_names_cover_catalogs_and_agree_with_importer():
    from ftplan.catalog.gpus import load_gpus
    from ftplan.catalog.offers import SKYPILOT_ACCELERATORS, _norm_accel, _resolve_skypilot, load_offers
    from ftplan.export.skypilot import skypilot_names, sky_accelerator, sky_cloud

    table = skypilot_names()
    assert set(load_gpus()) <= set(table["accelerators"]), "a GPU of gpus.csv has no SkyPilot entry"
    for o in load_offers():
        assert o.provider.lower() in table["providers"], f"provider {o.provider} has no SkyPilot entry"
    mapping = {_norm_accel(k): v for k, v in SKYPILOT_ACCELERATORS.items()}
    gpus = load_gpus()
    for slug, entry in table["accelerators"].items():
        clouds = [None, *entry.get("per_cloud", {})]
        for cloud in clouds:
            name = sky_accelerator(slug, cloud)
            if name is None:
                continue
            back, _ = _resolve_skypilot(name, "", cloud or "", mapping, None)
            assert back is not None, f"{name} ({slug}) is unknown to the SkyPilot catalog importer"
            # same GPU up to SkyPilot's own ambiguity (SXM/PCIe/NVL variants share a name)
            assert gpus[back].memory_bytes // 10**10 == gpus[slug].memory_bytes // 10**10 or \
                back.split("-")[0] == slug.split("-")[0], (slug, cloud, name, back)
            if cloud == "runpod":
                assert back == slug
    assert sky_cloud("AWS") == ("aws", None)
    assert sky_cloud("CoreWeave")[0] is None and sky_cloud("Vast.ai")[0] == "vast"


def test_sky_clouds_are_skypilot_clouds(owners):
    if owners.sky is None:
        pytest.skip("skypilot not installed")
    try:  # skypilot >= 0.10
        from sky.skylet.constants import ALL_CLOUDS
    except ImportError:  # skypilot 0.9
        from sky.clouds.service_catalog.constants import ALL_CLOUDS

    from ftplan.export.skypilot import skypilot_names

    for prov, entry in skypilot_names()["providers"].items():
        assert entry["cloud"] is None or entry["cloud"] in ALL_CLOUDS, prov
