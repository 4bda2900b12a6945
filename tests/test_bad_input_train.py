"""``ftplan train`` refuses bad options, plans and setups before any run directory or record is
written (issue 16, items 1 and 10: ``--logging-steps 0``, malformed ``--from-json`` plans, missing
packages, flash attention on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ftplan.train as train_mod
from ftplan.errors import ConfigError
from ftplan.job import Job, Layout
from ftplan.train import check_dataset, load_plan_json, train

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100}


@pytest.fixture
def setup(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello"}\n')
    return model, data, tmp_path / "run"


def _nothing_written(tmp_path: Path, out: Path) -> None:
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "model"]


@pytest.mark.parametrize("kwargs, words", [
    ({"logging_steps": 0}, "logging_steps must be in 1.."),
    ({"logging_steps": -5}, "logging_steps must be in 1.."),
    ({"save_steps": 0}, "save_steps"),
    ({"max_steps": 10**12}, "max_steps"),
    ({"logging_steps": 2.5}, "logging_steps must be an integer"),
    ({"seed": 2**40}, "seed"),
    ({"seed": -1}, "seed"),
])
def test_bad_step_options_are_refused_before_anything(setup, kwargs, words):
    model, data, out = setup
    with pytest.raises(ConfigError, match=words):
        train(str(model), str(data), str(out), Job(), Layout(), **kwargs)
    _nothing_written(model.parent, out)


def test_non_finite_job_is_refused_before_anything(setup):
    model, data, out = setup
    for job in (Job(epochs=float("inf")), Job(epochs=float("nan")), Job(dataset_tokens=float("inf"))):
        with pytest.raises(ConfigError):
            train(str(model), str(data), str(out), job, Layout())
    _nothing_written(model.parent, out)


def test_record_in_a_missing_folder_is_refused_before_training(setup, monkeypatch):
    model, data, out = setup
    monkeypatch.setattr(train_mod, "check_machine", lambda job, layout: pytest.fail("checked too late"))
    with pytest.raises(ConfigError, match="does not exist"):
        train(str(model), str(data), str(out), Job(), Layout(), record=str(model.parent / "nope" / "r.jsonl"))
    _nothing_written(model.parent, out)


def test_missing_peft_is_a_setup_error_not_an_outcome(setup, monkeypatch):
    model, data, out = setup
    real = train_mod.importlib.util.find_spec
    monkeypatch.setattr(train_mod.importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    record = model.parent / "records.jsonl"
    with pytest.raises(ConfigError, match="needs the peft package"):
        train(str(model), str(data), str(out), Job(method="lora"), Layout(), record=str(record))
    _nothing_written(model.parent, out)
    assert not record.exists()


def test_flash_attention_on_cpu_is_refused_up_front(setup):
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "accelerate", "trl", "datasets")):
        pytest.skip("needs the train extra")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    model, data, out = setup
    with pytest.raises(ConfigError, match="attn=flash needs a CUDA GPU"):
        train(str(model), str(data), str(out), Job(attn_impl="flash"), Layout())
    _nothing_written(model.parent, out)


@pytest.mark.parametrize("spec, words", [
    ("data\x00.jsonl", r"U\+0000"),
    ("x" * 5000, "at most"),
    ("da\rta", r"U\+000D"),
])
def test_odd_dataset_names(spec, words):
    with pytest.raises(ConfigError, match=words):
        check_dataset(spec)


def test_odd_dataset_folders(tmp_path):
    d = tmp_path / "ds"
    d.mkdir()
    (d / "dataset_dict.json").write_text("[1, 2]")
    (d / "a.jsonl").write_text("[" * 100_000 + "\n")
    with pytest.raises(ConfigError) as e:
        check_dataset(str(d))
    assert "\n" not in e.value.one_line()
    assert check_dataset("x" * 300) == ("hub", None)  # longer than NAME_MAX: a hub name, not a crash


# ---------------------------------------------------------------------------------------------
# --from-json plans
# ---------------------------------------------------------------------------------------------
GOOD_PLAN = {"schema": "ftplan.estimate/1", "job": {"method": "lora", "precision": "bf16-mixed", "optimizer": "adamw",
                                                   "micro_batch": 1, "seq_len": 128, "grad_accum": 1,
                                                   "gradient_checkpointing": False, "attn_impl": "sdpa",
                                                   "lora": {"r": 8, "alpha": 16, "dropout": 0.0,
                                                            "target_modules": ["all-linear"]}},
             "layout": {"gpus_per_node": 1, "nodes": 1, "strategy": "single", "offload_optimizer": False,
                        "offload_params": False, "tp": 1, "pp": 1}}


def _plan_file(tmp_path, text: str) -> str:
    p = tmp_path / "plan.json"
    p.write_text(text, encoding="utf-8")
    return str(p)


@pytest.mark.parametrize("text", [
    '{"job": {"epochs": NaN}, "layout": {}}',
    "[" * 50_000,
    '{"plans": [1, 2]}',
    '{"plans": [{"job": "x", "layout": {}}]}',
    '{"job": {"method": "lora", "lora": "r=8"}, "layout": {"gpus_per_node": 1}}',
    '{"job": {"micro_batch": "many"}, "layout": {"gpus_per_node": 1, "nodes": 1, "strategy": "single"}}',
    '{"job": {"micro_batch": 1e400}, "layout": {"gpus_per_node": 1, "nodes": 1, "strategy": "single"}}',
    "\x00",
    "[]",
])
def test_malformed_plans_are_one_line(tmp_path, text):
    with pytest.raises(ConfigError) as e:
        load_plan_json(_plan_file(tmp_path, text))
    assert "\n" not in e.value.one_line()


def test_good_plan_and_bad_index(tmp_path):
    path = _plan_file(tmp_path, json.dumps(GOOD_PLAN))
    job, layout = load_plan_json(path)
    assert job.method == "lora" and layout.world_size == 1
    for index in (True, "1", 1.0):
        with pytest.raises(ConfigError, match="plan must be an integer"):
            load_plan_json(path, index)


_leaf = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=5)
_val = st.recursive(_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                    max_leaves=5)


@FUZZ
@given(section=st.sampled_from(["job", "layout", "job.lora", ""]),
       key=st.sampled_from(["method", "micro_batch", "seq_len", "epochs", "dataset_tokens", "gpus_per_node",
                            "nodes", "strategy", "tp", "r", "dropout", "target_modules", "plans", "per_gpu",
                            "plan", "job", "layout", "lora", "quant"]),
       value=_val)
def test_fuzz_train_plan_files(tmp_path, section, key, value):
    doc = json.loads(json.dumps(GOOD_PLAN))
    node = doc
    for part in filter(None, section.split(".")):
        node = node[part]
    node[key] = value
    try:
        job, layout = load_plan_json(_plan_file(tmp_path, json.dumps(doc)))
    except ConfigError as e:
        assert "\n" not in e.one_line()
        return
    assert isinstance(job, Job) and isinstance(layout, Layout)


def test_model_name_too_long_for_the_file_system_is_a_config_error():
    """A 300-character model reference (ENAMETOOLONG from the file system, found by
    test_fuzz_cli) is one ConfigError, not an internal error."""
    with pytest.raises(ConfigError, match="cannot be read"):
        train_mod.check_model_dir("x" * 300)
