"""``ftplan train`` and the exported TRL script (``ftplan.export.script``).

* the rendered script for full / LoRA / QLoRA: it compiles, imports nothing from ftplan, and its
  constants block holds the plan's choices;
* bad input (missing model folder, missing dataset, dataset without a usable field, ...) is one
  line with exit code 2, and no output folder is created;
* end to end on CPU (needs trl + datasets, skipped otherwise): a tiny random Llama and a tokenizer
  built here (no network), a 32-row JSONL dataset, ``ftplan train`` for 3 steps with LoRA and with
  full fine-tuning on chat rows: adapter / weights, a checkpoint, the report and a measurement record.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ftplan.catalog.models import resolve_model
from ftplan.cli import main
from ftplan.errors import ConfigError
from ftplan.export.script import HF_OPTIM, render_train_script
from ftplan.job import Job, Layout, LoraSpec, QuantSpec
from ftplan.train import check_dataset, load_plan_json, write_run_dir

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the quick brown fox jumps over a lazy dog while planners count bytes and tokens on "
         "every device before buying time").split()


def _constants(src: str) -> dict:
    """Module-level ``NAME = literal`` assignments of the script (the constants block)."""
    out = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.isupper():
                try:
                    out[name] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return out


def _imports(src: str) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module.split(".")[0])
    return mods


# ---------------------------------------------------------------------------------------------
# the rendered script
# ---------------------------------------------------------------------------------------------
LLAMA = "llama-3.1-8b"

CASES = {
    "full": (Job(method="full", precision="bf16-mixed", optimizer="adamw", micro_batch=4, seq_len=1024,
                 grad_accum=8, gradient_checkpointing=True, attn_impl="flash"),
             {"METHOD": "full", "MODEL_DTYPE": "float32", "TRAINABLE_DTYPE": "float32", "BF16": True,
              "FP16": False, "OPTIM": "adamw_torch_fused", "MICRO_BATCH": 4, "GRAD_ACCUM": 8,
              "MAX_LENGTH": 1024, "GRADIENT_CHECKPOINTING": True, "ATTN_IMPLEMENTATION": "flash_attention_2"}),
    "lora": (Job(method="lora", precision="bf16", optimizer="adafactor", micro_batch=2, seq_len=512,
                 gradient_checkpointing=False, lora=LoraSpec(r=8, alpha=16, dropout=0.1, target_modules=("q_proj", "v_proj"))),
             {"METHOD": "lora", "MODEL_DTYPE": "bfloat16", "TRAINABLE_DTYPE": "bfloat16", "BF16": False,
              "FP16": False, "OPTIM": "adafactor", "MICRO_BATCH": 2, "MAX_LENGTH": 512,
              "GRADIENT_CHECKPOINTING": False, "ATTN_IMPLEMENTATION": "sdpa", "LORA_R": 8, "LORA_ALPHA": 16,
              "LORA_DROPOUT": 0.1, "LORA_TARGET_MODULES": ["q_proj", "v_proj"]}),
    "qlora": (Job(method="qlora", precision="fp16-mixed", optimizer="paged_adamw_8bit", seq_len=4096,
                  gradient_checkpointing=True, attn_impl="eager",
                  quant=QuantSpec(quant_type="fp4", double_quant=False, compute_dtype="fp16")),
              {"METHOD": "qlora", "MODEL_DTYPE": "float16", "TRAINABLE_DTYPE": "float32", "BF16": False,
               "FP16": True, "OPTIM": "paged_adamw_8bit", "MAX_LENGTH": 4096, "GRADIENT_CHECKPOINTING": True,
               "ATTN_IMPLEMENTATION": "eager", "LORA_TARGET_MODULES": "all-linear", "QUANT_TYPE": "fp4",
               "DOUBLE_QUANT": False, "COMPUTE_DTYPE": "float16", "QUANT_STORAGE": "uint8",
               "KBIT_PREPARE": True}),
    # TRL SFTTrainer's own QLoRA path: no kbit preparation, the bf16 adapters TRL casts are kept
    "qlora-trl": (Job(method="qlora", quant=QuantSpec(recipe="trl")),
                  {"METHOD": "qlora", "MODEL_DTYPE": "bfloat16", "TRAINABLE_DTYPE": "bfloat16", "BF16": True,
                   "KBIT_PREPARE": False, "SHARDED_QLORA": False}),
}


@pytest.mark.parametrize("method", sorted(CASES))
def test_script_renders_the_plan(method):
    job, expected = CASES[method]
    src = render_train_script(resolve_model(LLAMA), job, Layout(), model_ref="meta-llama/Llama-3.1-8B")
    compile(src, "train.py", "exec")
    consts = _constants(src)
    assert consts["MODEL"] == "meta-llama/Llama-3.1-8B"
    for k, v in expected.items():
        assert consts[k] == v, k
    # standalone: only the training stack, never ftplan
    assert "ftplan" not in _imports(src)
    assert _imports(src) <= {"argparse", "dataclasses", "json", "math", "os", "statistics", "sys", "time",
                             "importlib", "torch", "transformers", "trl", "peft", "datasets"}
    for name in ("SFTTrainer", "SFTConfig", "LoraConfig", "max_length", "use_reentrant", "--report-json",
                 "--max-steps", "--num-epochs", "--save-steps", "--logging-steps", "--seed", "--output-dir"):
        assert name in src, name
    if method.startswith("qlora"):
        assert "BitsAndBytesConfig" in src and "prepare_model_for_kbit_training" in src


def test_script_sharded_qlora_and_sgd():
    job = Job(method="qlora", optimizer="sgd", micro_batch=1, seq_len=2048)
    src = render_train_script(resolve_model(LLAMA), job, Layout(gpus_per_node=4, strategy="fsdp"),
                              model_ref="m")
    c = _constants(src)
    assert c["QUANT_STORAGE"] == "bfloat16" and c["WORLD_SIZE"] == 4 and c["STRATEGY"] == "fsdp"
    assert c["KBIT_PREPARE"] is False and c["TRAINABLE_DTYPE"] == "float32"
    # TRL's recipe under FSDP: the engine holds what PEFT's does (fp32 trainable parameters)
    c2 = _constants(render_train_script(resolve_model(LLAMA), job.with_(quant=QuantSpec(recipe="trl")),
                                        Layout(gpus_per_node=4, strategy="fsdp"), model_ref="m"))
    assert c2["KBIT_PREPARE"] is False and c2["TRAINABLE_DTYPE"] == "float32"
    assert c["OPTIM"] == "sgd" and c["OPTIM_ARGS"] == "momentum=0.9"  # ftplan models SGD's momentum buffer
    assert "accelerate launch --num_processes 4" in src


def test_optimizer_names_are_transformers_names():
    tr = pytest.importorskip("transformers.training_args")
    names = {o.value for o in tr.OptimizerNames}
    assert {v for v, _ in HF_OPTIM.values()} <= names


def test_render_rejects_invalid_job():
    with pytest.raises(ConfigError):
        render_train_script(resolve_model(LLAMA), Job(method="lora", lora=LoraSpec(target_modules=("nope",))),
                            Layout(), model_ref="m")


def test_planning_modules_do_not_import_torch():
    code = ("import sys, ftplan.cli, ftplan.cli.train, ftplan.train, ftplan.export.script; "
            "ftplan.cli.build_parser(); assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------------------------
# inputs (no torch needed: checked before anything heavy)
# ---------------------------------------------------------------------------------------------
@pytest.fixture()
def fake_model(tmp_path) -> Path:
    """A model folder that passes the file checks (config, tokenizer, weights file)."""
    from ftplan.measure.configs import tiny_config  # stdlib only

    d = tmp_path / "fake-model"
    d.mkdir()
    cfg = tiny_config(json.loads((ROOT / "src/ftplan/catalog/data/models/llama-3.2-1b.json").read_text())["config"])
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "tokenizer.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    return d


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _bad(capsys, argv, out: Path) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("ftplan: error: "), err
    assert not out.exists()
    return err


def test_missing_model_dir(tmp_path, capsys):
    data = _write_jsonl(tmp_path / "d.jsonl", [{"text": "a b"}])
    out = tmp_path / "out"
    err = _bad(capsys, ["train", str(tmp_path / "nope"), "--dataset", str(data), "--out", str(out)], out)
    assert "no model directory" in err


def test_model_dir_without_tokenizer(tmp_path, fake_model, capsys):
    (fake_model / "tokenizer.json").unlink()
    data = _write_jsonl(tmp_path / "d.jsonl", [{"text": "a b"}])
    out = tmp_path / "out"
    assert "tokenizer" in _bad(capsys, ["train", str(fake_model), "--dataset", str(data), "--out", str(out)], out)


def test_missing_dataset(tmp_path, fake_model, capsys):
    out = tmp_path / "out"
    err = _bad(capsys, ["train", str(fake_model), "--dataset", str(tmp_path / "missing.jsonl"), "--out", str(out)],
               out)
    assert "no dataset" in err


def test_dataset_without_fields(tmp_path, fake_model, capsys):
    data = _write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a"}] * 3)
    out = tmp_path / "out"
    err = _bad(capsys, ["train", str(fake_model), "--dataset", str(data), "--out", str(out)], out)
    assert "fields found: question, answer" in err


def test_chat_dataset_needs_chat_template(tmp_path, fake_model, capsys):
    data = _write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    out = tmp_path / "out"
    assert "chat_template" in _bad(capsys, ["train", str(fake_model), "--dataset", str(data), "--out", str(out)],
                                   out)


def test_multi_node_plan_is_refused(tmp_path, fake_model, capsys):
    data = _write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    out = tmp_path / "out"
    err = _bad(capsys, ["train", str(fake_model), "--dataset", str(data), "--out", str(out), "--gpus", "8",
                        "--nodes", "2", "--strategy", "zero3"], out)
    assert "nodes" in err


def test_check_dataset_forms(tmp_path):
    assert check_dataset(str(_write_jsonl(tmp_path / "a.jsonl", [{"prompt": "p", "completion": "c"}]))) == \
        ("local", ("prompt", "completion"))
    (tmp_path / "b.json").write_text(json.dumps([{"text": "x", "id": 1}]))
    assert check_dataset(str(tmp_path / "b.json")) == ("local", ("text",))
    (tmp_path / "c.csv").write_text("id,text\n1,hello\n")
    assert check_dataset(str(tmp_path / "c.csv")) == ("local", ("text",))
    folder = tmp_path / "folder"
    folder.mkdir()
    _write_jsonl(folder / "part-0.jsonl", [{"messages": []}])
    assert check_dataset(str(folder)) == ("local", ("messages",))
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string"}}}))
    assert check_dataset(str(saved)) == ("local", ("text",))
    assert check_dataset("trl-lib/Capybara") == ("hub", None)  # checked by the script when it loads it
    (tmp_path / "e.jsonl").write_text('{"text": "a"}\nnot json\n')
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        check_dataset(str(tmp_path / "e.jsonl"))


def test_plan_json(tmp_path):
    doc = {"schema": "ftplan.recommend/1",
           "job": {"method": "lora", "precision": "bf16-mixed", "seq_len": 2048, "epochs": 2.0,
                   "lora": {"r": 32, "alpha": 64, "dropout": 0.0, "target_modules": ["q_proj"]}},
           "plans": [{"job": {"method": "lora", "micro_batch": 2, "grad_accum": 4, "seq_len": 2048,
                              "gradient_checkpointing": True},
                      "layout": {"gpus_per_node": 2, "nodes": 1, "strategy": "zero2", "offload_optimizer": False,
                                 "offload_params": False, "tp": 1, "pp": 1, "strategy_label": "zero2"}}]}
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    job, layout = load_plan_json(p, 1)
    assert (job.method, job.micro_batch, job.grad_accum, job.gradient_checkpointing, job.epochs) == \
        ("lora", 2, 4, True, 2.0)
    assert job.lora.r == 32 and job.lora.target_modules == ("q_proj",)
    assert (layout.world_size, layout.strategy) == (2, "zero2")
    with pytest.raises(ConfigError, match="out of range"):
        load_plan_json(p, 2)


def test_run_dir_is_atomic(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real = Path.write_text
    calls = []

    def flaky(self, text, *a, **k):
        calls.append(self.name)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", flaky)
    with pytest.raises(OSError):
        write_run_dir(out, {"train.py": "print(1)\n", "plan.json": "{}"})
    monkeypatch.undo()
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no partial folder, no temp left
    write_run_dir(out, {"train.py": "print(1)\n", "plan.json": "{}"})
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "train.py"]
    with pytest.raises(ConfigError, match="not empty"):
        write_run_dir(out, {"train.py": ""})


# ---------------------------------------------------------------------------------------------
# end to end on CPU
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random Llama (hidden 64, 2 layers) and a WordLevel tokenizer with a chat template."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from ftplan.measure.torchref import TINY_CONFIGS, build_model

    d = tmp_path_factory.mktemp("tiny-llama")
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS) + " user assistant :"],
                            trainers.WordLevelTrainer(special_tokens=["<unk>", "<pad>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
    fast.save_pretrained(d)
    cfg = dict(TINY_CONFIGS["llama"], pad_token_id=1, bos_token_id=2, eos_token_id=3)
    build_model(cfg, attn_implementation="sdpa").save_pretrained(d)
    return d


def _rows(n: int, chat: bool):
    import random

    r = random.Random(0)
    rows = []
    for _ in range(n):
        a = " ".join(r.choice(WORDS) for _ in range(r.randint(6, 24)))
        b = " ".join(r.choice(WORDS) for _ in range(r.randint(6, 24)))
        rows.append({"messages": [{"role": "user", "content": a}, {"role": "assistant", "content": b}]}
                    if chat else {"text": a + " " + b, "id": len(rows)})
    return rows


def _train(tmp_path, tiny_model, capfd, monkeypatch, extra, chat=False):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # tiny matmuls: threads only add overhead
    data = _write_jsonl(tmp_path / "data.jsonl", _rows(32, chat))
    out = tmp_path / "run"
    record = tmp_path / "records.jsonl"
    rc = main(["train", str(tiny_model), "--dataset", str(data), "--out", str(out), "--seq-len", "64",
               "--micro-batch", "2", "--max-steps", "3", "--save-steps", "2", "--logging-steps", "1",
               "--record", str(record), *extra])
    cap = capfd.readouterr()
    assert rc == 0, cap.err[-3000:] + cap.out[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] == 3 and report["device"] == "cpu" and report["tokens_per_s"] > 0
    assert report["peak_allocated_bytes"] is None and 0 < report["max_seq_len_seen"] <= 64
    assert (out / "checkpoint-2").is_dir() and (out / "train.py").is_file() and (out / "plan.json").is_file()
    assert (out / "tokenizer.json").is_file()
    assert "it/s" in (out / "train.log").read_text()  # the trainer's progress bar was streamed
    assert "peak memory was not measured" in cap.out
    from ftplan.measure.records import load_records

    recs, problems = load_records([record])
    assert problems == [] and len(recs) == 1
    rec = recs[0]
    assert rec["outcome"] == "ok" and rec["run"]["device"] == "cpu" and rec["measured"]["tokens_per_s"] > 0
    assert rec["job"]["seq_len"] == report["max_seq_len_seen"]  # the longest padded batch is what ran
    return out, report


def test_train_lora_end_to_end(tmp_path, tiny_model, capfd, monkeypatch):
    out, report = _train(tmp_path, tiny_model, capfd, monkeypatch, ["--method", "lora", "--lora-r", "4"])
    assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
    assert (out / "checkpoint-2" / "adapter_model.safetensors").is_file()
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4
    assert report["plan"]["METHOD"] == "lora" and report["plan"]["PRECISION"] == "bf16-mixed"


def test_train_full_chat_end_to_end(tmp_path, tiny_model, capfd, monkeypatch):
    out, report = _train(tmp_path, tiny_model, capfd, monkeypatch,
                         ["--method", "full", "--precision", "fp32", "--optimizer", "sgd"], chat=True)
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert (out / "checkpoint-2" / "model.safetensors").is_file()
    assert not (out / "adapter_config.json").exists()


def test_script_field_error_lists_fields(tiny_model):
    """A hub dataset is checked by the script itself: same one-line error, exit code 2."""
    from datasets import Dataset

    job = Job(method="lora", seq_len=64)
    src = render_train_script(resolve_model(str(tiny_model)), job, Layout(), model_ref=str(tiny_model))
    ns: dict = {"__name__": "train_script"}
    exec(compile(src, "train.py", "exec"), ns)
    ds = Dataset.from_dict({"question": ["q"], "answer": ["a"]})
    with pytest.raises(SystemExit) as e:
        ns["select_fields"](ds, "org/name")
    assert e.value.code == 2
    kept, fields = ns["select_fields"](Dataset.from_dict({"prompt": ["p"], "completion": ["c"], "x": [1]}), "d")
    assert fields == ("prompt", "completion") and kept.column_names == ["prompt", "completion"]


def test_multi_gpu_launch(tmp_path):
    from ftplan.train import _accelerate_files, launch_command

    layout = Layout(gpus_per_node=4, strategy="zero2")
    files = _accelerate_files(Job(method="lora"), layout, "t")
    assert "accelerate_config.yaml" in files and "ds_config.json" in files  # the config names ds_config.json
    cmd = launch_command(tmp_path, layout, ["--dataset", "d"])
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"]
    assert cmd[cmd.index("--num_processes") + 1] == "4" and cmd[-3:] == [str(tmp_path / "train.py"), "--dataset", "d"]
    assert launch_command(tmp_path, Layout(), ["x"]) == [sys.executable, str(tmp_path / "train.py"), "x"]


def test_minimal_accelerate_config_parses():
    yaml = pytest.importorskip("yaml")
    from ftplan.train import _minimal_accelerate_config

    for strategy, kind in (("ddp", "MULTI_GPU"), ("zero3", "DEEPSPEED"), ("fsdp", "FSDP")):
        cfg = yaml.safe_load(_minimal_accelerate_config(Job(), Layout(gpus_per_node=2, strategy=strategy)))
        assert cfg["distributed_type"] == kind and cfg["num_processes"] == 2 and cfg["mixed_precision"] == "bf16"


def test_from_json_with_overrides(tmp_path):
    from ftplan.cli import build_parser
    from ftplan.cli.train import job_and_layout

    p = tmp_path / "est.json"
    p.write_text(json.dumps({"schema": "ftplan.estimate/1",
                             "job": {"method": "qlora", "seq_len": 512, "gradient_checkpointing": True,
                                     "lora": {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": ["all-linear"]}},
                             "layout": {"gpus_per_node": 1, "nodes": 1, "strategy": "single"}}))
    a = build_parser().parse_args(["train", "m", "--dataset", "d", "--out", "o", "--from-json", str(p),
                                   "--micro-batch", "4", "--lora-r", "8", "--gpus", "2"])
    job, layout = job_and_layout(a)
    assert (job.method, job.seq_len, job.gradient_checkpointing, job.micro_batch) == ("qlora", 512, True, 4)
    assert (job.lora.r, job.lora.alpha) == (8, 32)
    assert (layout.world_size, layout.strategy) == (2, "ddp")


def test_cuda_summary_and_record_are_valid(tmp_path):
    """The CUDA side without a GPU: the summary table and a record that ``ftplan validate`` reads."""
    from ftplan.measure.records import append_record
    from ftplan.measure.validate import render_text, validate_paths
    from ftplan.train import Machine, _predict, build_record, compare_text

    spec = resolve_model(LLAMA)
    job, layout = Job(method="qlora", seq_len=2048, gradient_checkpointing=True), Layout()
    report = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "device_total_bytes": 85 * 10**9,
              "world_size": 1, "peak_allocated_bytes": 9 * 2**30, "peak_reserved_bytes": 10 * 2**30, "steps": 5,
              "step_times_s": [2.0, 1.0, 1.0, 1.0, 1.0], "median_step_s": 1.0, "tokens_per_s": 1500.0,
              "max_seq_len_seen": 1024, "wall_s": 6.0, "cuda": "12.8", "versions": {"torch": "2.13.0"},
              "plan": {"ATTN_IMPLEMENTATION": "sdpa"}}
    machine = Machine("cuda", 1, report["device_name"])
    pred = _predict(spec, job, layout, machine.gpu_name)
    pred_seen = _predict(spec, job.with_(seq_len=1024), layout, machine.gpu_name)
    assert pred["tokens_per_s"] and pred_seen["peak_allocated_bytes"] < pred["peak_allocated_bytes"]
    text = compare_text(report, pred, pred_seen, job)
    assert "peak allocated" in text and "9.00 GiB" in text and "predicted @ 1024 tokens" in text
    rec = build_record(model_ref=LLAMA, spec=spec, config=dict(spec.config), job=job.with_(seq_len=1024),
                       layout=layout, report=report, predicted=pred_seen, outcome="ok", error=None, seed=0,
                       machine=machine, notes=[])
    path = tmp_path / "r.jsonl"
    append_record(path, rec)
    doc = validate_paths([path])
    assert doc["problems"] == [] and doc["n_records"] == 1
    render_text(doc)


def test_run_streaming_passes_output_and_exit_code(tmp_path):
    import io

    from ftplan.train import run_streaming

    sink = io.StringIO()
    rc, tail = run_streaming([sys.executable, "-c", "import sys; print('step 1/2'); print('boom'); sys.exit(3)"],
                             tmp_path / "log.txt", echo=sink, cwd=tmp_path)
    assert rc == 3 and "boom" in tail and "step 1/2" in sink.getvalue()
    assert "boom" in (tmp_path / "log.txt").read_text()


def test_train_qlora_trl_recipe_end_to_end(tmp_path, tiny_model, capfd, monkeypatch):
    """TRL SFTTrainer's own QLoRA path through the exported script on CPU (bitsandbytes 4-bit runs
    there): no prepare_model_for_kbit_training, the adapters stay in the bf16 TRL casts them to."""
    pytest.importorskip("bitsandbytes")
    out, report = _train(tmp_path, tiny_model, capfd, monkeypatch,
                         ["--method", "qlora", "--qlora-recipe", "trl", "--lora-r", "4"])
    assert report["plan"]["METHOD"] == "qlora"
    c = _constants((out / "train.py").read_text())
    assert c["KBIT_PREPARE"] is False and c["TRAINABLE_DTYPE"] == "bfloat16"
    raw = (out / "adapter_model.safetensors").read_bytes()  # header: u64 length + JSON
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}


def test_mxfp4_checkpoint_is_dequantized_for_lora_and_refused_for_qlora(tmp_path, tiny_model, capsys):
    """gpt-oss's config.json says its experts are MXFP4 (inference-only kernels): the script loads it
    with ``Mxfp4Config(dequantize=True)`` for LoRA and full fine-tuning (the weights ftplan plans), and
    stops a QLoRA plan with one line and exit 2 before loading anything (transformers refuses a
    BitsAndBytesConfig for an MXFP4 checkpoint)."""
    import json

    pytest.importorskip("transformers")
    from ftplan.catalog.models import load_model_catalog

    gpt_oss = tmp_path / "gpt-oss"
    gpt_oss.mkdir()
    (gpt_oss / "config.json").write_text(json.dumps(load_model_catalog()["gpt-oss-20b"].config))
    spec = resolve_model("gpt-oss-20b")
    for method in ("lora", "qlora"):
        src = render_train_script(spec, Job(method=method), Layout(), model_ref=str(gpt_oss))
        ns: dict = {"__name__": "train_script"}
        exec(compile(src, "train.py", "exec"), ns)
        assert ns["_is_mxfp4"](str(gpt_oss)) and not ns["_is_mxfp4"](str(tiny_model))
        if method == "qlora":
            with pytest.raises(SystemExit) as e:
                ns["load_model"](str(gpt_oss))
            assert e.value.code == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "MXFP4" in err[0] and "BitsAndBytesConfig" in err[0]


def test_unknown_model_type_with_a_known_architecture_loads_transformers_code(tmp_path, tiny_model, capsys,
                                                                               monkeypatch):
    """Kimi K2's config.json says model_type ``kimi_k2`` (remote code) and architectures
    ``["DeepseekV3ForCausalLM"]``: the script loads transformers' own DeepseekV3ForCausalLM (the model
    ftplan planned) without trust_remote_code; its FP8 blocks are dequantized for LoRA
    (``FineGrainedFP8Config(dequantize=True)``) and a QLoRA plan stops with one line; a type transformers
    does not know with no architecture it implements stops with one line too."""
    import json

    pytest.importorskip("transformers")
    import transformers

    from ftplan.measure.torchref import TINY_CONFIGS, build_model

    kimi = tmp_path / "kimi"
    build_model(TINY_CONFIGS["deepseek_v3"], dtype="fp32").save_pretrained(kimi)
    raw = json.loads((kimi / "config.json").read_text())
    raw.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"],
               auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                         "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"})
    (kimi / "config.json").write_text(json.dumps(raw))
    spec = resolve_model("kimi-k2")

    def script(method):
        ns: dict = {"__name__": "train_script"}
        exec(compile(render_train_script(spec, Job(method=method, lora=LoraSpec(dropout=0.0)), Layout(),
                                         model_ref=str(kimi)), "train.py", "exec"),
             ns)
        return ns

    model = script("lora")["load_model"](str(kimi))
    assert type(model).__name__ in ("DeepseekV3ForCausalLM", "PeftModelForCausalLM")
    assert model.config.model_type == "deepseek_v3"

    # FP8 checkpoint (DeepSeek-V3 / Kimi K2 ship 128x128-block FP8): dequantized for LoRA, refused for QLoRA
    raw["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    (kimi / "config.json").write_text(json.dumps(raw))
    seen = {}
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda ref, **kw: seen.update(kw) or (_ for _ in ()).throw(RuntimeError("stop")))
    with pytest.raises(RuntimeError, match="stop"):
        script("lora")["load_model"](str(kimi))
    qc = seen["quantization_config"]
    assert type(qc).__name__ == "FineGrainedFP8Config" and qc.dequantize is True
    assert seen["config"].model_type == "deepseek_v3"
    capsys.readouterr()  # the loads' progress bars
    with pytest.raises(SystemExit) as e:
        script("qlora")["load_model"](str(kimi))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FP8" in err[0] and "BitsAndBytesConfig" in err[0]

    raw.update(model_type="no_such_type", architectures=["NoSuchForCausalLM"])
    (kimi / "config.json").write_text(json.dumps(raw))
    with pytest.raises(SystemExit) as e:
        script("lora")["load_model"](str(kimi))
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "no_such_type" in err[0] and "NoSuchForCausalLM" in err[0]


def test_tokenizer_that_needs_remote_code_fails_with_one_line(tmp_path, tiny_model, capsys, monkeypatch):
    """A checkpoint whose tokenizer cannot load (here: none at all; Kimi K2's is remote code) stops
    train.py with one line and exit 2, naming the model; when transformers says the tokenizer needs
    its own code, the line points at --trust-remote-code."""
    import shutil

    pytest.importorskip("transformers")
    import transformers

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tiny_model / "config.json", bare / "config.json")
    data = _write_jsonl(tmp_path / "data.jsonl", _rows(4, False))
    src = render_train_script(resolve_model(str(tiny_model)), Job(method="lora"), Layout(), model_ref=str(bare))
    ns: dict = {"__name__": "train_script"}
    exec(compile(src, "train.py", "exec"), ns)
    with pytest.raises(SystemExit) as e:
        ns["main"](["--model", str(bare), "--dataset", str(data), "--output-dir", str(tmp_path / "o")])
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.startswith("train.py:")]
    assert e.value.code == 2 and len(err) == 1 and "cannot load the tokenizer" in err[0] and str(bare) in err[0]

    def remote(*a, **k):
        raise ValueError("The repository contains custom code which must be executed; set trust_remote_code=True")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", remote)
    with pytest.raises(SystemExit) as e:
        ns["main"](["--model", str(bare), "--dataset", str(data), "--output-dir", str(tmp_path / "o")])
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.startswith("train.py:")]
    assert e.value.code == 2 and len(err) == 1 and "--trust-remote-code" in err[0]
