"""Owners' parsers for exported bundles (shared by tests/test_export*.py).

Every file is read back by the project that runs it:

* ``accelerate_config.yaml``: accelerate's ``load_config_from_file``, the launcher's own validation
  (``_validate_launch_command``) and the environment it gives the processes, from which the plugins
  every process builds are constructed: ``DeepSpeedPlugin`` (reads ``ds_config.json``),
  ``FullyShardedDataParallelPlugin`` (FSDP2 settings) and ``ParallelismConfig`` (TP / HSDP sizes);
* ``ds_config.json``: transformers' ``HfTrainerDeepSpeedConfig`` fills the ``auto`` values from the
  training script's own numbers (refusing mismatches), then DeepSpeed's ``DeepSpeedConfig`` parses it;
* ``sky.yaml``: ``sky.Task.from_yaml``. SkyPilot >= 0.10 reads ``resources.infra``; CI has 0.9.2
  (newer SkyPilot pins click<8.2, which huggingface-hub 2.x cannot use), whose schema predates
  ``infra``: there the file is loaded after the documented mapping ``infra: cloud`` -> ``cloud``,
  and the ``infra`` values are checked against SkyPilot 0.14.1's ``infra`` pattern;
* ``axolotl.yaml``: axolotl's ``validate_config`` when axolotl is importable, and always the key/type
  table encoded from its schema (``ftplan.export.axolotl.SCHEMA_KEYS``);
* ``llamafactory.yaml`` (+ ``dataset_info.json``): LLaMA-Factory's ``_parse_train_args`` when it is
  importable, and always the encoded key/type table.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

#: SkyPilot 0.14.1 ``sky/utils/schemas.py`` ``_get_infra_pattern()``: cloud[/region[/zone]], "*" wildcards
INFRA_RE = re.compile(r"^(\*|[a-z0-9-]+)(/[^/\s]+){0,2}$")


def load_owners() -> SimpleNamespace:
    """The owners' modules (each None when not installed): import once per test module."""
    ns = SimpleNamespace(accel=None, ds=None, sky=None, yaml=None)
    try:
        import yaml

        ns.yaml = yaml
    except ImportError:
        pass
    if importlib.util.find_spec("accelerate") is not None and ns.yaml is not None:
        import accelerate.commands.launch as launch
        from accelerate.commands.config.config_args import load_config_from_file

        ns.accel = SimpleNamespace(launch=launch, load=load_config_from_file)
    if importlib.util.find_spec("deepspeed") is not None:
        from deepspeed.runtime.config import DeepSpeedConfig
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
        from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

        ns.ds = SimpleNamespace(DeepSpeedConfig=DeepSpeedConfig, Zero=DeepSpeedZeroConfig, Hf=HfTrainerDeepSpeedConfig)
    if importlib.util.find_spec("sky") is not None:
        import sky

        ns.sky = sky
    return ns


def script_numbers(job: dict, bundle: dict[str, str]) -> dict:
    """MICRO_BATCH, GRAD_ACCUM, BF16, FP16 as train.py sets them (from its constants block)."""
    if "train.py" in bundle:
        ns: dict = {}
        block = bundle["train.py"].split("# ---- the plan", 1)[1].split("\n# ---", 1)[0]
        exec(compile(block.split("\n", 1)[1], "train.py constants", "exec"), ns)  # literals only
        return {k: ns[k] for k in ("MICRO_BATCH", "GRAD_ACCUM", "BF16", "FP16", "ENGINE", "TP_SIZE", "DP_SHARD")}
    return {"MICRO_BATCH": job["micro_batch"], "GRAD_ACCUM": job["grad_accum"],
            "BF16": job["precision"] == "bf16-mixed", "FP16": job["precision"] == "fp16-mixed"}


def _clear_env(monkeypatch) -> None:
    for k in list(os.environ):
        if k.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_")):
            monkeypatch.delenv(k, raising=False)


def check_accelerate(owners, out: Path, plan: dict, monkeypatch, config: str = "accelerate_config.yaml") -> dict:
    accel = owners.accel
    lo = plan["layout"]
    world = lo["gpus_per_node"] * lo["nodes"]
    cfg = accel.load(str(out / config))
    assert type(cfg).__name__ == "ClusterConfig"
    assert cfg.num_machines == lo["nodes"] and cfg.num_processes == world
    argv = ["--config_file", config]
    if lo["nodes"] > 1:
        argv += ["--machine_rank", "1", "--main_process_ip", "10.0.0.1"]
    monkeypatch.chdir(out)
    _clear_env(monkeypatch)
    args = accel.launch.launch_command_parser().parse_args(argv + ["train.py", "--dataset", "d.jsonl"])
    a, defaults, mp_from_config = accel.launch._validate_launch_command(args)
    assert a.num_processes == world and a.num_machines == lo["nodes"]
    env: dict[str, str] = {}
    kind = cfg.distributed_type.value
    if kind == "DEEPSPEED":
        from accelerate.utils import DeepSpeedPlugin
        from accelerate.utils.launch import prepare_deepspeed_cmd_env

        assert a.use_deepspeed
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        a.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(a)
        for k, v in env.items():
            if k.startswith("ACCELERATE_"):
                monkeypatch.setenv(k, v)
        plugin = DeepSpeedPlugin()  # what every process builds: reads ds_config.json, refuses conflicts
        ds_cfg = json.loads((out / "ds_config.json").read_text())
        assert plugin.zero_stage == ds_cfg["zero_optimization"]["stage"]
        assert plugin.zero3_init_flag == (plugin.zero_stage == 3)
        if lo["tp"] > 1:
            assert plugin.deepspeed_config["tensor_parallel"]["autotp_size"] == lo["tp"]
    elif kind == "FSDP":
        from accelerate.utils import FullyShardedDataParallelPlugin
        from accelerate.utils.launch import prepare_multi_gpu_env

        assert a.use_fsdp
        env = prepare_multi_gpu_env(a)
        assert env["FSDP_VERSION"] == "2"
        assert env["FSDP_RESHARD_AFTER_FORWARD"] == "true"
        assert env["FSDP_OFFLOAD_PARAMS"] == str(lo["offload_params"]).lower()
        # the training script turns gradient checkpointing on; FSDP's must stay off (transformers refuses both)
        assert env["FSDP_ACTIVATION_CHECKPOINTING"] == "false"
        assert env["ACCELERATE_MIXED_PRECISION"] == {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(
            plan["job"]["precision"], "no")
        for k, v in env.items():
            if k.startswith(("FSDP_", "ACCELERATE_", "PARALLELISM_CONFIG_")):
                monkeypatch.setenv(k, v)
        plugin = FullyShardedDataParallelPlugin()  # what every process builds from that environment
        assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
        assert bool(plugin.cpu_offload.offload_params if hasattr(plugin.cpu_offload, "offload_params")
                    else plugin.cpu_offload) == lo["offload_params"] or not lo["offload_params"]
    elif kind == "MULTI_GPU":
        from accelerate.utils.launch import prepare_multi_gpu_env

        assert a.multi_gpu
        env = prepare_multi_gpu_env(a)
    else:
        assert kind == "NO" and world == 1
    if cfg.parallelism_config:
        from accelerate.parallelism_config import ParallelismConfig

        assert env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true"
        for k, v in env.items():
            if k.startswith("PARALLELISM_CONFIG_"):
                monkeypatch.setenv(k, v)
        pc = ParallelismConfig()  # what the Accelerator builds from the launcher's environment
        assert pc.total_size == world
        assert pc.tp_size == lo["tp"]
        if lo["tp"] > 1:
            assert kind == "MULTI_GPU" and pc.dp_shard_size * pc.dp_replicate_size == lo["gpus_per_node"] * lo[
                "nodes"] // lo["tp"]
        else:
            assert kind == "FSDP" and pc.dp_replicate_size == lo["nodes"] and pc.dp_shard_size == lo["gpus_per_node"]
    return env


def check_deepspeed(owners, out: Path, plan: dict, bundle: dict[str, str], monkeypatch) -> None:
    ds = owners.ds
    lo, job = plan["layout"], plan["job"]
    world = lo["gpus_per_node"] * lo["nodes"]
    tp = lo["tp"]
    cfg = json.loads((out / "ds_config.json").read_text())
    nums = script_numbers(job, bundle)
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
    assert '"auto"' not in json.dumps(filled), filled
    zero = ds.Zero(**filled["zero_optimization"])
    stage = int(zero.stage)
    want = {"single": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}[lo["strategy"]]
    assert stage == want
    import deepspeed.runtime.config as dsc

    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dsc.dist, "get_world_size", lambda *a, **k: world)
    c = ds.DeepSpeedConfig(filled)
    assert c.world_size == world
    assert c.train_micro_batch_size_per_gpu == job["micro_batch"]
    assert c.gradient_accumulation_steps == job["grad_accum"]
    # HF fills train_batch_size over the whole world (TP ranks included); DeepSpeed, initialized by
    # accelerate without an mpu, counts the same world
    assert c.train_batch_size == job["micro_batch"] * job["grad_accum"] * world
    if tp > 1:
        assert c.tensor_parallel_config.autotp_size == tp
    assert c.zero_optimization_stage == stage
    assert c.bfloat16_config.enabled == (job["precision"] == "bf16-mixed")
    assert c.float16_config.enabled == (job["precision"] == "fp16-mixed")
    off_opt = c.zero_config.offload_optimizer
    off_par = c.zero_config.offload_param
    assert (off_opt is not None and off_opt.device == "cpu") == lo["offload_optimizer"]
    assert (off_par is not None and off_par.device == "cpu") == lo["offload_params"]
    if lo["offload_optimizer"]:
        assert c.optimizer_name == "adamw"  # DeepSpeedCPUAdam runs the offloaded step


def _legacy_sky(doc):
    """SkyPilot < 0.10 has no ``infra``: ``infra: cloud[/region[/zone]]`` -> cloud/region/zone."""
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if k == "infra":
                assert INFRA_RE.match(v), v
                parts = v.split("/")
                out["cloud"] = parts[0]
                if len(parts) > 1:
                    out["region"] = parts[1]
                if len(parts) > 2:
                    out["zone"] = parts[2]
            else:
                out[k] = _legacy_sky(v)
        return out
    if isinstance(doc, list):
        return [_legacy_sky(x) for x in doc]
    return doc


def sky_has_infra(sky) -> bool:
    from sky.utils import schemas

    return "infra" in schemas._get_single_resources_schema()["properties"]


def check_sky(owners, out: Path, plan: dict, launch_text: str) -> None:
    sky = owners.sky
    lo, offer = plan["layout"], plan["offer"]
    text = (out / "sky.yaml").read_text()
    path = out / "sky.yaml"
    if not sky_has_infra(sky):
        doc = _legacy_sky(owners.yaml.safe_load(text))
        path = out.parent / f".{out.name}-sky-legacy.yaml"
        path.write_text(owners.yaml.safe_dump(doc))
    task = sky.Task.from_yaml(str(path))
    assert task.num_nodes == lo["nodes"]
    res = list(task.resources)
    assert res
    first = res[0]
    (name, count), = first.accelerators.items()
    assert count == offer["gpus_per_instance"] >= lo["gpus_per_node"]
    for r in res:
        assert list(r.accelerators.values()) == [count]
    spot = offer["pricing"] == "spot"
    assert first.use_spot == spot
    if spot:
        assert first.job_recovery and first.job_recovery["strategy"] == "EAGER_NEXT_REGION"
    assert launch_text in text
    assert ("SKYPILOT_NODE_RANK" in text and "SKYPILOT_NODE_IPS" in text) == (lo["nodes"] > 1)
    assert set(task.envs) >= {"MODEL", "DATASET", "OUTPUT_DIR", "HF_TOKEN"}


def check_axolotl(out: Path, plan: dict) -> dict:
    from ftplan.export.axolotl import FSDP_KEYS, SCHEMA_KEYS

    import yaml

    cfg = yaml.safe_load((out / "axolotl.yaml").read_text())
    for k, v in cfg.items():
        assert k in SCHEMA_KEYS, f"axolotl.yaml: {k} is not a key of axolotl's schema"
        assert isinstance(v, SCHEMA_KEYS[k]), (k, v)
    for k in cfg.get("fsdp_config") or {}:
        assert k in FSDP_KEYS, k
    job, lo = plan["job"], plan["layout"]
    assert cfg["micro_batch_size"] == job["micro_batch"] and cfg["gradient_accumulation_steps"] == job["grad_accum"]
    assert cfg["sequence_len"] == job["seq_len"]
    assert cfg["gradient_checkpointing"] == job["gradient_checkpointing"]
    assert ("adapter" in cfg) == (job["method"] != "full")
    assert cfg.get("load_in_4bit", False) == (job["method"] == "qlora")
    if cfg.get("tensor_parallel_size", 1) > 1:
        assert cfg["deepspeed"] == "ds_config.json" and cfg["tensor_parallel_size"] == lo["tp"]
    if "fsdp_config" in cfg:
        assert cfg["fsdp_version"] == 2 and "deepspeed" not in cfg
        assert cfg["dp_shard_size"] * cfg.get("dp_replicate_size", 1) == lo["gpus_per_node"] * lo["nodes"]
    if importlib.util.find_spec("axolotl") is not None:  # the owner's validator (not installable in CI)
        from axolotl.utils.config import validate_config
        from axolotl.utils.dict import DictDefault

        here = os.getcwd()
        os.chdir(out)
        try:
            got = validate_config(DictDefault(copy.deepcopy(cfg)))
        finally:
            os.chdir(here)
        assert got["micro_batch_size"] == job["micro_batch"]
    return cfg


def check_llamafactory(out: Path, plan: dict) -> dict:
    from ftplan.export.llamafactory import SCHEMA_KEYS

    import yaml

    cfg = yaml.safe_load((out / "llamafactory.yaml").read_text())
    for k, v in cfg.items():
        assert k in SCHEMA_KEYS, f"llamafactory.yaml: {k} is not an argument of LLaMA-Factory"
        assert isinstance(v, SCHEMA_KEYS[k]), (k, v)
    info = json.loads((out / "dataset_info.json").read_text())
    assert cfg["dataset"] in info and info[cfg["dataset"]]["formatting"] == "sharegpt"
    job = plan["job"]
    assert cfg["per_device_train_batch_size"] == job["micro_batch"] and cfg["cutoff_len"] == job["seq_len"]
    assert cfg["disable_gradient_checkpointing"] == (not job["gradient_checkpointing"])
    assert (cfg["finetuning_type"] == "full") == (job["method"] == "full")
    assert ("deepspeed" in cfg) == (out / "ds_config.json").exists()
    if importlib.util.find_spec("llamafactory") is not None:  # the owner's parser (not installable in CI)
        os.environ.setdefault("DISABLE_VERSION_CHECK", "1")
        import transformers.training_args as ta
        from llamafactory.hparams.parser import _parse_train_args

        here = os.getcwd()
        os.chdir(out)
        real = ta.is_torch_bf16_gpu_available
        ta.is_torch_bf16_gpu_available = lambda *a, **k: True  # the file is checked, not this CPU machine
        try:
            model_args, data_args, training_args, finetuning_args, _ = _parse_train_args(copy.deepcopy(cfg))
        finally:
            ta.is_torch_bf16_gpu_available = real
            os.chdir(here)
        assert training_args.per_device_train_batch_size == job["micro_batch"]
        assert data_args.cutoff_len == job["seq_len"]
        assert finetuning_args.finetuning_type == cfg["finetuning_type"]
    return cfg


def check_bundle(out: Path, plan: dict, bundle: dict[str, str], owners, monkeypatch, target: str = "accelerate",
                 compile_script: bool = True) -> None:
    names = set(p.name for p in out.iterdir())
    assert names == set(bundle)
    assert {"README.md", "plan.json"} <= names
    assert json.loads((out / "plan.json").read_text()) == json.loads(json.dumps(plan))
    launch = {"accelerate": "accelerate launch --config_file accelerate_config.yaml",
              "deepspeed": "accelerate launch --config_file accelerate_config.yaml",
              "axolotl": "axolotl train axolotl.yaml",
              "llamafactory": "llamafactory.yaml"}[target]
    if "accelerate_config.yaml" in names:
        if owners.accel is None:
            pytest.skip("accelerate / pyyaml not installed")
        check_accelerate(owners, out, plan, monkeypatch)
    if "ds_config.json" in names:
        if owners.ds is None:
            pytest.skip("deepspeed not installed")
        check_deepspeed(owners, out, plan, bundle, monkeypatch)
    if "axolotl.yaml" in names:
        check_axolotl(out, plan)
    if "llamafactory.yaml" in names:
        check_llamafactory(out, plan)
    if "sky.yaml" in names:
        if owners.sky is None:
            pytest.skip("skypilot not installed")
        check_sky(owners, out, plan, launch)
    if "train.py" in names and compile_script:
        compile((out / "train.py").read_text(), "train.py", "exec")
    readme = (out / "README.md").read_text()
    assert f"{plan['memory']['device_total_bytes'] / 1e9:,.1f}" in readme
    assert f"${plan['cost']['usd']:,.2f}" in readme
    assert launch in readme
