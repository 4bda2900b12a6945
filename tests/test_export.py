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
from types import SimpleNamespace

import pytest

from ftplan.cli import main
from ftplan.errors import ConfigError
from ftplan.export import load_plan_json, plan_from_json, render_bundle, write_bundle

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
}


def _case(name: str):
    fixture, index, kw = CASES[name]
    plan, others = load_plan_json(DATA / fixture, index)
    return plan, others, kw


def _render(name: str) -> dict[str, str]:
    plan, others, kw = _case(name)
    return render_bundle(plan, alternatives=others, **kw)


# ---------------------------------------------------------------------------------------------
# owners' parsers (imported once per module; each skips cleanly when its package is missing)
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def accel():
    pytest.importorskip("yaml")
    mod = pytest.importorskip("accelerate.commands.launch")
    from accelerate.commands.config.config_args import load_config_from_file

    return SimpleNamespace(launch=mod, load=load_config_from_file)


@pytest.fixture(scope="module")
def ds():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    return SimpleNamespace(DeepSpeedConfig=DeepSpeedConfig, Zero=DeepSpeedZeroConfig, Hf=HfTrainerDeepSpeedConfig)


@pytest.fixture(scope="module")
def sky():
    return pytest.importorskip("sky")


def _script_numbers(job: dict, bundle: dict[str, str]) -> dict:
    """MICRO_BATCH, GRAD_ACCUM, BF16, FP16 as train.py sets them (from its constants block)."""
    if "train.py" in bundle:
        ns: dict = {}
        block = bundle["train.py"].split("# ---- the plan", 1)[1].split("\n# ---", 1)[0]
        exec(compile(block.split("\n", 1)[1], "train.py constants", "exec"), ns)  # literals only
        return {k: ns[k] for k in ("MICRO_BATCH", "GRAD_ACCUM", "BF16", "FP16")}
    return {"MICRO_BATCH": job["micro_batch"], "GRAD_ACCUM": job["grad_accum"],
            "BF16": job["precision"] == "bf16-mixed", "FP16": job["precision"] == "fp16-mixed"}


def check_accelerate(accel, out: Path, plan: dict, monkeypatch) -> dict:
    lo = plan["layout"]
    world = lo["gpus_per_node"] * lo["nodes"]
    cfg = accel.load(str(out / "accelerate_config.yaml"))
    assert type(cfg).__name__ == "ClusterConfig"
    assert cfg.num_machines == lo["nodes"] and cfg.num_processes == world
    argv = ["--config_file", "accelerate_config.yaml"]
    if lo["nodes"] > 1:
        argv += ["--machine_rank", "1", "--main_process_ip", "10.0.0.1"]
    monkeypatch.chdir(out)
    args = accel.launch.launch_command_parser().parse_args(argv + ["train.py", "--dataset", "d.jsonl"])
    a, defaults, mp_from_config = accel.launch._validate_launch_command(args)
    assert a.num_processes == world and a.num_machines == lo["nodes"]
    env: dict[str, str] = {}
    if cfg.distributed_type.value == "DEEPSPEED":
        from accelerate.utils.launch import prepare_deepspeed_cmd_env

        assert a.use_deepspeed
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        a.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(a)
        for k, v in env.items():
            if k.startswith("ACCELERATE_"):
                monkeypatch.setenv(k, v)
        from accelerate.utils import DeepSpeedPlugin

        plugin = DeepSpeedPlugin()  # what every process builds: reads ds_config.json, refuses conflicts
        assert plugin.zero_stage == int(lo["strategy"][-1])
        assert plugin.zero3_init_flag == (lo["strategy"] == "zero3")
    elif cfg.distributed_type.value == "FSDP":
        from accelerate.utils.launch import prepare_multi_gpu_env

        assert a.use_fsdp
        env = prepare_multi_gpu_env(a)
        assert env["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD"
        assert env["FSDP_OFFLOAD_PARAMS"] == str(lo["offload_params"]).lower()
        # train.py turns gradient checkpointing on; FSDP's must stay off (transformers refuses both)
        assert env["FSDP_ACTIVATION_CHECKPOINTING"] == "false"
        assert env["FSDP_USE_ORIG_PARAMS"] == "false"
        assert env["ACCELERATE_MIXED_PRECISION"] == {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(
            plan["job"]["precision"], "no")
    elif lo["strategy"] == "ddp":
        assert cfg.distributed_type.value == "MULTI_GPU" and a.multi_gpu
    else:
        assert cfg.distributed_type.value == "NO" and world == 1
    return env


def check_deepspeed(ds, out: Path, plan: dict, bundle: dict[str, str], monkeypatch) -> None:
    lo, job = plan["layout"], plan["job"]
    world = lo["gpus_per_node"] * lo["nodes"]
    cfg = json.loads((out / "ds_config.json").read_text())
    nums = _script_numbers(job, bundle)
    # the HF integration fills "auto" from the script's TrainingArguments and refuses mismatches
    hf = ds.Hf(copy.deepcopy(cfg))
    args = SimpleNamespace(world_size=world, per_device_train_batch_size=nums["MICRO_BATCH"],
                           gradient_accumulation_steps=nums["GRAD_ACCUM"], max_grad_norm=1.0, learning_rate=2e-5,
                           adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
                           save_on_each_node=False, fp16=nums["FP16"], fp16_full_eval=False, bf16=nums["BF16"],
                           bf16_full_eval=False, get_warmup_steps=lambda n: 0)
    hf.trainer_config_process(args)
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=8192))
    hf.trainer_config_finalize(args, model, num_training_steps=100)  # raises on any mismatch
    filled = hf.config
    assert "auto" not in json.dumps(filled)
    zero = ds.Zero(**filled["zero_optimization"])
    assert int(zero.stage) == int(lo["strategy"][-1])
    # DeepSpeed's own config parser, as rank 0 of the plan's world
    import deepspeed.runtime.config as dsc

    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dsc.dist, "get_world_size", lambda *a, **k: world)
    c = ds.DeepSpeedConfig(filled)
    assert c.world_size == world
    assert c.train_micro_batch_size_per_gpu == job["micro_batch"]
    assert c.gradient_accumulation_steps == job["grad_accum"]
    assert c.train_batch_size == job["micro_batch"] * job["grad_accum"] * world
    assert c.zero_optimization_stage == int(lo["strategy"][-1])
    assert c.bfloat16_config.enabled == (job["precision"] == "bf16-mixed")
    assert c.float16_config.enabled == (job["precision"] == "fp16-mixed")
    off_opt = c.zero_config.offload_optimizer
    off_par = c.zero_config.offload_param
    assert (off_opt is not None and off_opt.device == "cpu") == lo["offload_optimizer"]
    assert (off_par is not None and off_par.device == "cpu") == lo["offload_params"]
    if lo["offload_optimizer"]:
        assert c.optimizer_name == "adamw"  # DeepSpeedCPUAdam runs the offloaded step


def check_sky(sky, out: Path, plan: dict) -> None:
    lo, offer = plan["layout"], plan["offer"]
    task = sky.Task.from_yaml(str(out / "sky.yaml"))
    assert task.num_nodes == lo["nodes"]
    res = list(task.resources)
    assert res
    first = res[0]
    (name, count), = first.accelerators.items()
    assert count == offer["gpus_per_instance"] >= lo["gpus_per_node"]
    for r in res:
        assert r.use_spot == (offer["pricing"] == "spot") or r is not first
        assert list(r.accelerators.values()) == [count]
    text = (out / "sky.yaml").read_text()
    assert "accelerate launch --config_file accelerate_config.yaml" in text
    assert ("SKYPILOT_NODE_RANK" in text) == (lo["nodes"] > 1)
    assert set(task.envs) >= {"MODEL", "DATASET", "OUTPUT_DIR", "HF_TOKEN"}
    setup = task.setup or ""
    assert "trl" in setup and "accelerate" in setup
    assert ("deepspeed" in setup) == (out / "ds_config.json").exists()
    assert ("bitsandbytes" in setup) == (plan["job"]["method"] == "qlora" or "8bit" in plan["job"]["optimizer"])


def check_bundle(out: Path, plan: dict, bundle: dict[str, str], accel, ds, sky, monkeypatch) -> None:
    names = set(p.name for p in out.iterdir())
    assert names == set(bundle)
    assert {"accelerate_config.yaml", "README.md", "plan.json"} <= names
    assert json.loads((out / "plan.json").read_text()) == json.loads(json.dumps(plan))
    check_accelerate(accel, out, plan, monkeypatch)
    assert ("ds_config.json" in names) == (plan["layout"]["strategy"] in ("zero1", "zero2")
                                           or (plan["layout"]["strategy"] == "zero3" and
                                               "DEEPSPEED" in (out / "accelerate_config.yaml").read_text()))
    if "ds_config.json" in names:
        check_deepspeed(ds, out, plan, bundle, monkeypatch)
    if "sky.yaml" in names:
        check_sky(sky, out, plan)
    if HAS_SCRIPT:
        compile((out / "train.py").read_text(), "train.py", "exec")
    readme = (out / "README.md").read_text()
    assert f"{plan['memory']['device_total_bytes'] / 1e9:,.1f}" in readme
    assert f"${plan['cost']['usd']:,.2f}" in readme
    assert "accelerate launch --config_file accelerate_config.yaml" in readme


# ---------------------------------------------------------------------------------------------
# fixed plans: owners' parsers + goldens
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_bundle_parses(name, tmp_path, accel, ds, sky, monkeypatch):
    plan, _, _ = _case(name)
    files = _render(name)
    out = write_bundle(files, tmp_path / "bundle")
    check_bundle(out, plan, files, accel, ds, sky, monkeypatch)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    files = _render(name)
    assert ("train.py" in files) == HAS_SCRIPT
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
    assert "ds_config.json" not in q
    assert 'distributed_type: "NO"' in q["accelerate_config.yaml"]
    assert 'DATASET: trl-lib/Capybara' in q["sky.yaml"]
    lf = _render("lora-fsdp")
    assert "distributed_type: FSDP" in lf["accelerate_config.yaml"]
    # the chosen offer is on CoreWeave (no SkyPilot cloud): asked on any cloud, after named clouds
    assert "CoreWeave" in lf["README.md"] and "any cloud" in lf["README.md"]
    off = json.loads(_render("full-zero3-offload")["ds_config.json"])
    assert off["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert off["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert off["optimizer"]["type"] == "AdamW"
    assert "memory:" in _render("full-zero3-offload")["sky.yaml"]
    mn = _render("full-zero3-multinode")
    assert "num_machines: 8" in mn["accelerate_config.yaml"] and "num_processes: 64" in mn["accelerate_config.yaml"]
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
def test_layout_variants_parse(layout, backend, kind, tmp_path, accel, ds, sky, monkeypatch):
    plan = _variant(**layout)
    files = render_bundle(plan, zero3_backend=backend)
    assert f"distributed_type: {kind}" in files["accelerate_config.yaml"]
    out = write_bundle(files, tmp_path / "b")
    check_bundle(out, plan, files, accel, ds, sky, monkeypatch)


@pytest.mark.parametrize("change,match", [
    ({"layout": {"tp": 8, "strategy": "single"}}, "tensor/pipeline"),
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
def test_cli_export_live(name, tmp_path, accel, ds, sky, monkeypatch, capsys):
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
    else:
        assert lo["strategy"] == "zero3" and lo["nodes"] > 1
        assert (out / "ds_config.json").exists()
    files = {p.name: p.read_text() for p in out.iterdir()}
    check_bundle(out, plan, files, accel, ds, sky, monkeypatch)


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
    "tensor-parallel plan": (lambda t: ["llama-3.1-70b", "--method", "full", "--tokens", "20M",
                                        "--gpus-filter", "b200", "--max-gpus", "8"], "tensor/pipeline"),
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


def test_sky_clouds_are_skypilot_clouds(sky):
    try:  # skypilot >= 0.10
        from sky.skylet.constants import ALL_CLOUDS
    except ImportError:  # skypilot 0.9
        from sky.clouds.service_catalog.constants import ALL_CLOUDS

    from ftplan.export.skypilot import skypilot_names

    for prov, entry in skypilot_names()["providers"].items():
        assert entry["cloud"] is None or entry["cloud"] in ALL_CLOUDS, prov
