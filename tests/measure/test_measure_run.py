"""``ftplan measure`` end to end on CPU with tiny models; OOM as an outcome; resumable matrices."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import ftplan.cli as cli  # noqa: E402
from ftplan.cli.measure import row_to_argv  # noqa: E402
from ftplan.measure import hf  # noqa: E402
from ftplan.measure import run as R  # noqa: E402
from ftplan.measure.records import SCHEMA, load_records  # noqa: E402

pytestmark = pytest.mark.torch

# the real qwen2.5-0.5b architecture (tied embeddings, q/k/v biases): shrunk by --tiny
QWEN = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "tie_word_embeddings": True, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06, "hidden_act": "silu"}


@pytest.fixture()
def config_path(tmp_path):
    p = tmp_path / "qwen.json"
    p.write_text(json.dumps(QWEN))
    return str(p)


def main(*argv) -> int:
    return cli.main([str(a) for a in argv])


def test_cpu_end_to_end_writes_valid_record(config_path, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc = main("measure", config_path, "--tiny", "--method", "lora", "--steps", 3, "--seq-len", 32,
              "--micro-batch", 2, "--device", "cpu", "--out", out)
    assert rc == 0
    text = capsys.readouterr().out
    assert "measured" in text and "predicted" in text
    recs, problems = load_records([out])
    assert problems == [] and len(recs) == 1
    r = recs[0]
    assert r["schema"] == SCHEMA and r["outcome"] == "ok"
    assert r["run"]["device"] == "cpu" and r["run"]["tiny"] is True and r["model"]["tiny"] is True
    assert r["model"]["config"]["hidden_size"] == 64 and r["model"]["config"]["tie_word_embeddings"] is True
    m = r["measured"]
    assert len(m["step_times_s"]) == 3 and m["median_step_s"] > 0 and m["tokens_per_s"] > 0
    assert m["peak_allocated_bytes"] is None  # no caching allocator on CPU
    t = m["tensors"]
    assert t["param_bytes"] > 0 and t["grad_bytes"] > 0 and t["optimizer_state_bytes"] > 0
    assert t["saved_activation_bytes"] > 0
    p = r["predicted"]
    assert p["peak_allocated_bytes"] > 0 and p["device_total_bytes"] >= p["peak_reserved_bytes"]
    assert r["env"]["torch"] == torch.__version__ and r["job"]["method"] == "lora"
    # LoRA: the trainable parameters are the adapters, whose count ftplan predicts exactly
    assert p["params_trainable"] * 4 * 4 == t["grad_bytes"] * 4  # fp32 grads of every adapter
    # validate reads it back (CPU group, model states / activations only)
    assert main("validate", out) == 0
    assert "cpu" in capsys.readouterr().out


def test_oom_is_an_outcome(config_path, tmp_path, monkeypatch, capsys):
    def boom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(R, "_train_steps", boom)
    out = tmp_path / "r.jsonl"
    rc = main("measure", config_path, "--tiny", "--steps", 2, "--seq-len", 16, "--device", "cpu", "--out", out)
    assert rc == 0
    (r,), _ = load_records([out])
    assert r["outcome"] == "oom" and "out of memory" in r["error"]
    assert r["measured"]["peak_is_lower_bound"] is True
    assert "\n" not in r["error"]


def test_other_failure_is_error_outcome(config_path, tmp_path, monkeypatch):
    def bad(*a, **k):
        raise ValueError("shape mismatch\nsecond line")

    monkeypatch.setattr(R, "_train_steps", bad)
    out = tmp_path / "r.jsonl"
    assert main("measure", config_path, "--tiny", "--steps", 1, "--seq-len", 16, "--device", "cpu",
                "--out", out) == 1
    (r,), _ = load_records([out])
    assert r["outcome"] == "error" and r["error"] == "ValueError: shape mismatch second line"


def test_matrix_resumes_and_builds_once(config_path, tmp_path, monkeypatch, capsys):
    matrix = tmp_path / "m.csv"
    matrix.write_text(
        "model,method,micro_batch,seq_len,gc,steps\n"
        f"{config_path},full,1,16,false,2\n"
        f"{config_path},lora,1,16,false,2\n"
        f"{config_path},full,2,16,true,2\n"
        f"{config_path},lora,2,24,false,2\n"
    )
    out = tmp_path / "r.jsonl"
    builds = []
    real_build = hf.build_for_job
    monkeypatch.setattr(hf, "build_for_job", lambda *a, **k: builds.append(a[1].method) or real_build(*a, **k))
    real_measure = R.measure
    calls = []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_measure(*a, **k)

    monkeypatch.setattr(R, "measure", interrupted)
    assert main("measure", "--matrix", matrix, "--tiny", "--device", "cpu", "--out", out) == 130
    recs, _ = load_records([out])
    assert len(recs) == 2
    # rows are grouped by model build: full (rows 1, 3) first, one build for both
    assert [r["job"]["method"] for r in recs] == ["full", "full"]
    assert builds == ["full"] and recs[1]["run"]["model_reused"] is True
    monkeypatch.setattr(R, "measure", real_measure)
    assert main("measure", "--matrix", matrix, "--tiny", "--device", "cpu", "--out", out) == 0
    recs, problems = load_records([out])
    assert problems == [] and len(recs) == 4 and len({r["key"] for r in recs}) == 4
    assert builds == ["full", "lora"]
    err = capsys.readouterr().err
    assert "skipped" in err and "4/4" in err
    # --remeasure: every row again, appended after the first records (which stay as written)
    before = out.read_bytes()
    assert main("measure", "--matrix", matrix, "--tiny", "--device", "cpu", "--out", out, "--remeasure") == 0
    assert out.read_bytes().startswith(before)
    recs, _ = load_records([out])
    assert len(recs) == 8 and len({r["key"] for r in recs}) == 4


def test_row_to_argv():
    argv = row_to_argv({"model": "m", "method": "qlora", "batch": 4, "gc": True, "double_quant": False,
                        "lora_targets": ["q_proj", "v_proj"], "steps": 3})
    assert argv == ["--method", "qlora", "--micro-batch", "4", "--gc", "--no-double-quant",
                    "--lora-targets", "q_proj,v_proj"]


def test_tiny_config_keeps_structure():
    t = R.tiny_config({**QWEN})
    assert t["hidden_size"] == 64 and t["num_hidden_layers"] == 2 and t["tie_word_embeddings"] is True
    assert t["num_key_value_heads"] == 2 and t["model_type"] == "qwen2"


@pytest.mark.parametrize("argv, needle", [
    (("measure", "no-such-model-xyz", "--steps", 1), "unknown model"),
    (("measure", "{cfg}", "--tiny", "--steps", 0, "--device", "cpu"), "--steps"),
    (("measure", "{cfg}", "--method", "lorax", "--device", "cpu"), "unknown method"),
    (("measure", "{cfg}", "--gpus", 2, "--device", "cpu"), "one GPU"),
    (("measure", "--matrix", "{tmp}/missing.yaml", "--out", "{tmp}/o.jsonl"), "no matrix file"),
    (("validate", "{tmp}/missing.jsonl"), "no record file"),
    (("validate", "{tmp}/bad.jsonl"), "malformed JSON"),
])
def test_bad_inputs_one_line_exit_2(argv, needle, config_path, tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    argv = [str(a).format(cfg=config_path, tmp=tmp_path) for a in argv]
    assert main(*argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and needle in err[-1] and err[-1].startswith("ftplan: error:")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_lora_tiny(config_path, tmp_path):
    out = tmp_path / "r.jsonl"
    assert main("measure", config_path, "--tiny", "--method", "lora", "--steps", 3, "--seq-len", 64,
                "--device", "cuda", "--out", out) == 0
    (r,), _ = load_records([out])
    m = r["measured"]
    assert r["outcome"] == "ok" and m["peak_allocated_bytes"] >= m["baseline_allocated_bytes"] > 0
    assert m["peak_reserved_bytes"] >= m["peak_allocated_bytes"]


def _param_table(model) -> dict:
    """name -> (shape, dtype, requires_grad, the first name sharing its storage)."""
    first: dict[int, str] = {}
    out = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        ptr = p.data_ptr()
        first.setdefault(ptr, n)
        out[hf.strip_peft_prefix(n)] = (tuple(p.shape), str(p.dtype), p.requires_grad,
                                        hf.strip_peft_prefix(first[ptr]))
    return out


@pytest.mark.parametrize("tied", [True, False])
def test_qlora_build_holds_what_from_pretrained_holds(tied):
    """``measure`` builds QLoRA models one layer at a time (never a bf16 copy of the model); what it
    holds must be what transformers' ``from_pretrained(quantization_config=...)`` +
    ``prepare_model_for_kbit_training`` + PEFT hold, tied output embedding included (a meta-built
    model was left untied: one fp32 vocab x hidden matrix too many on tied families)."""
    import warnings

    from peft import prepare_model_for_kbit_training

    from ftplan.job import Job, LoraSpec
    from ftplan.measure.configs import text_config, tiny_config

    cfg = tiny_config({**QWEN, "tie_word_embeddings": tied})
    job = Job(method="qlora", micro_batch=2, seq_len=32, lora=LoraSpec(r=8, alpha=16, dropout=0.1))
    built = hf.build_for_job(cfg, job, "cpu")
    mt, c = text_config(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = hf.build_model({**c, "model_type": mt}, dtype="bf16", quantization="nf4-dq")
        ref = prepare_model_for_kbit_training(ref, use_gradient_checkpointing=False)
        ref = hf.apply_lora(ref, r=8, alpha=16, dropout=0.1, target_modules="all-linear").model
    assert _param_table(built) == _param_table(ref)
    lm = _param_table(built)["lm_head.weight"][3]
    assert (lm == "model.embed_tokens.weight") is tied


@pytest.mark.parametrize("model,options", [
    # ftplan's (TRL's) defaults: fused-head loss, checkpointing on (the recompute closures' RoPE
    # tables and position ids are saved bytes too)
    ("qwen2.5-0.5b", {"method": "lora"}),
    # a tied-embedding family under QLoRA, no checkpointing
    ("qwen2.5-0.5b", {"method": "qlora", "gradient_checkpointing": False, "loss": "hf"}),
    # torchtitan's op SAC: the cache is part of what the forward leaves
    ("llama-3.1-8b", {"method": "full", "checkpointing": "selective"}),
    # no sdpa path (attention sinks): run, recorded and predicted with the eager attention
    # transformers runs, whose sliding and full masks the recompute closures both hold although
    # the window (128) covers the sequence
    ("gpt-oss-20b", {"method": "lora"}),
])
def test_measure_records_what_the_formulas_predict_exactly(model, options):
    """``ftplan measure`` on CPU (tiny) counts the model states and saved activations the formulas
    predict, to the byte: what ``validate`` scores on the bundled records, re-run here."""
    from ftplan import api
    from ftplan.measure.validate import evaluate_record

    rec = api.measure(model, tiny=True, device="cpu", steps=1, micro_batch=2, seq_len=32, **options)
    assert rec["outcome"] == "ok", rec["error"]
    assert rec["job"]["attn_impl"] == rec["run"]["attn_implementation"]
    row = evaluate_record(rec)
    assert row["model_states_err_pct"] == 0.0
    assert row["activations_predicted"] == row["activations_measured"]
