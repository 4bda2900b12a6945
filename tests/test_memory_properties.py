"""Properties of the memory model over random options (hypothesis), and bad-input handling."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftplan.catalog.models import load_model_catalog, resolve_model
from ftplan.cli import main
from ftplan.errors import FtplanError
from ftplan.job import Job, Layout, LoraSpec
from ftplan.memory import activation_parts, estimate_memory

MODELS = sorted(load_model_catalog())
jobs = st.builds(
    Job,
    method=st.sampled_from(["full", "lora", "qlora"]),
    precision=st.sampled_from(["bf16-mixed", "bf16", "fp32", "fp16-mixed"]),
    optimizer=st.sampled_from(["adamw", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd"]),
    micro_batch=st.integers(1, 16),
    seq_len=st.integers(1, 32768),
    gradient_checkpointing=st.booleans(),
    attn_impl=st.sampled_from(["sdpa", "flash", "eager"]),
    lora=st.builds(LoraSpec, r=st.integers(1, 256), dropout=st.sampled_from([0.0, 0.05, 0.1])),
)


def _peft_ok(model, job):
    """PEFT refuses LoRA dropout on fused MoE experts (all-linear), transformers flash attention on
    Llama 4: such jobs are invalid input."""
    from dataclasses import replace

    from ftplan.job import lora_wraps_experts

    from ftplan.model import FAMILIES

    if job.attn_impl == "flash" and not FAMILIES[model.family].supports_flash:
        job = job.with_(attn_impl="sdpa")  # (Llama 4: transformers has no flash path, refused)
    if lora_wraps_experts(model, job.lora) and job.lora.dropout > 0:
        return job.with_(lora=replace(job.lora, dropout=0.0))
    return job


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(MODELS), job=jobs, grow=st.integers(1, 4096), which=st.sampled_from(["seq", "mb"]))
def test_memory_never_falls_as_batch_or_sequence_grows(name, job, grow, which):
    model = resolve_model(name)
    job = _peft_ok(model, job)
    a = estimate_memory(model, job)
    bigger = job.with_(seq_len=job.seq_len + grow) if which == "seq" else job.with_(micro_batch=job.micro_batch + grow % 8 + 1)
    b = estimate_memory(model, bigger)
    assert b.peak_allocated_bytes >= a.peak_allocated_bytes
    assert b.device_total_bytes >= a.device_total_bytes
    assert b.model_states_bytes == a.model_states_bytes


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(MODELS), job=jobs, n=st.integers(2, 64))
def test_zero3_model_states_never_rise_with_more_gpus(name, job, n):
    model = resolve_model(name)
    job = _peft_ok(model, job)
    small = estimate_memory(model, job, Layout(gpus_per_node=n, strategy="zero3"))
    large = estimate_memory(model, job, Layout(gpus_per_node=n + 1, strategy="zero3"))
    assert large.model_states_bytes <= small.model_states_bytes


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(MODELS), job=jobs)
def test_components_add_up(name, job):
    model = resolve_model(name)
    mem = estimate_memory(model, _peft_ok(model, job))
    c = mem.components
    assert all(v >= 0 for v in c.values())
    assert mem.peak_reserved_bytes == mem.peak_allocated_bytes + c["allocator_reserve"]
    assert mem.device_total_bytes == mem.peak_reserved_bytes + c["cuda_context"]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(MODELS), job=jobs, accum=st.integers(2, 16), gpus=st.sampled_from([1, 2]))
def test_accumulation_adds_at_most_the_autocast_cache_at_the_forward_end(name, job, accum, gpus):
    """With gradient accumulation the gradients are alive through the next micro-batch's forward,
    whose end also holds autocast's cached weight copies (tests/test_loss_peak_vs_torch.py measures
    them): the peak can rise by at most those copies (and, for full fine-tuning on one GPU, by the
    gradients a single micro-batch has not made yet at its loss's backward)."""
    model = resolve_model(name)
    job = _peft_ok(model, job)
    lay = Layout(gpus_per_node=gpus, strategy="single" if gpus == 1 else "ddp")
    one = estimate_memory(model, job, lay)
    acc = estimate_memory(model, job.with_(grad_accum=accum), lay)
    cache = activation_parts(model, job, lay).autocast_cache_bytes
    # one micro-batch: the forward's end (autocast's cached copies of every checkpointed layer, no
    # gradients yet) can top full fine-tuning's backward moments on one GPU (long rows), never
    # the summed gradients of the other layouts
    assert one.peak_phase != "forward_end" or (job.method == "full" and gpus == 1)
    # full fine-tuning on one GPU: with one micro-batch only the head's gradient exists at the
    # loss's backward; with accumulation they all do (from the earlier micro-batches)
    grads_not_made = 0
    if job.method == "full" and gpus == 1:
        from ftplan.memory import _head_grad_bytes

        grads_not_made = one.model_states_bytes - (one.components["frozen_weights"] + one.components["trainable_weights"]
                                                   + one.components["master_weights"]
                                                   + one.components["optimizer_states"]) - _head_grad_bytes(model, job)
    assert 0 <= acc.peak_allocated_bytes - one.peak_allocated_bytes <= cache + max(0, grads_not_made)
    assert acc.model_states_bytes == one.model_states_bytes
    if acc.peak_phase == "forward_end":
        assert cache > 0 and any("autocast cache" in n for n in acc.notes)
    if acc.peak_phase != "optimizer_step":
        assert sum(acc.components.values()) == acc.device_total_bytes


def test_full_fine_tuning_with_accumulation_peaks_at_the_forward_end():
    """fp32 weights under autocast, checkpointing, a short micro-batch: the cached bf16 copies of
    every layer (2 B per matmul weight) outweigh the recompute transient."""
    model = resolve_model("llama-3.2-1b")
    job = Job(method="full", micro_batch=1, seq_len=512, loss="trl")
    one, acc = estimate_memory(model, job), estimate_memory(model, job.with_(grad_accum=8))
    cache = activation_parts(model, job).autocast_cache_bytes
    layers = sum(lin.in_features * lin.out_features * lin.count for lin in model.linears()) - model.params.lm_head
    assert cache == 2 * layers
    assert acc.peak_phase == "forward_end" and one.peak_phase == "forward_backward"
    assert acc.peak_allocated_bytes - one.peak_allocated_bytes > cache // 2
    # pure bf16 weights and sharded engines have no autocast copies to cache
    assert activation_parts(model, job.with_(precision="bf16")).autocast_cache_bytes == 0
    assert activation_parts(model, job, Layout(gpus_per_node=2, strategy="fsdp")).autocast_cache_bytes == 0
    # torchao float8 casts its converted linears itself (every layer linear of this model), and
    # Transformer Engine's modules make their own FP8 copies: nothing in autocast's cache
    for recipe in ("fp8-tensorwise", "fp8-te-current"):
        assert activation_parts(model, job.with_(precision=recipe)).autocast_cache_bytes == 0


def test_fractional_bytes_are_exact():
    # 4-bit weights weigh half a byte: a QLoRA 70B base is ~35 GB, never 0 (llm-analysis' bug)
    mem = estimate_memory(resolve_model("llama-3.1-70b"), Job(method="qlora"))
    assert 30e9 < mem.components["frozen_weights"] < 50e9


def test_70b_full_model_states_and_b200(capsys):
    assert main(["estimate", "llama-3.1-70b", "--seq-len", "2048", "--gpu", "b200", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["params_total"] == 70_553_706_496
    assert doc["per_gpu"]["model_states_bytes"] > 1.1e12
    assert doc["fits"] is False


def test_70b_qlora_json_schema(capsys):
    assert main(["estimate", "llama-3.1-70b", "--method", "qlora", "--seq-len", "2048", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["params_total"] == 70_553_706_496
    for key in ("components", "model_states_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
                "device_total_bytes"):
        assert key in doc["per_gpu"]
    assert "host_bytes" in doc and "params_trainable" in doc


@pytest.mark.parametrize("argv", [
    ["estimate", "llama-70b"],
    ["estimate", "llama-3.1-70b", "--method", "lora", "--lora-r", "0"],
    ["estimate", "llama-3.1-70b", "--seq-len", "0"],
    ["estimate", "llama-3.1-70b", "--seq-len", "-5"],
    ["estimate", "llama-3.1-70b", "--gpus", "3", "--tp", "3"],
    ["estimate", "llama-3.1-70b", "--method", "lora", "--lora-targets", "c_attn"],
    ["estimate", "llama-3.1-70b", "--method", "fp8"],
    ["estimate", "llama-3.1-70b", "--optimizer", "adamw8"],
    ["estimate", "llama-3.1-70b", "--gpu", "h1000"],
    ["estimate", "/nonexistent/config.json"],
    ["estimate", "llama-3.1-70b", "--strategy", "zero3"],
])
def test_bad_input_is_one_line_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ftplan: error:") and "\n" not in err and "Traceback" not in err


def test_malformed_and_unsupported_configs(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["estimate", str(bad)]) == 2
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 768}))
    assert main(["estimate", str(gpt2)]) == 2
    err = capsys.readouterr().err
    assert "unsupported architecture" in err and "llama" in err
    neg = tmp_path / "neg.json"
    neg.write_text(json.dumps({"model_type": "llama", "hidden_size": -1}))
    assert main(["estimate", str(neg)]) == 2


@settings(max_examples=50, deadline=None)
@given(seq=st.integers(-10, 10**6), mb=st.integers(-3, 64), r=st.integers(-2, 512),
       method=st.sampled_from(["full", "lora", "qlora", "bogus"]), tp=st.integers(1, 9),
       gpus=st.integers(1, 16), strategy=st.sampled_from(["single", "ddp", "zero3", "fsdp", "zero9"]))
def test_cli_never_tracebacks(seq, mb, r, method, tp, gpus, strategy):
    argv = ["estimate", "qwen2.5-7b", "--seq-len", str(seq), "--micro-batch", str(mb), "--lora-r", str(r),
            "--method", method, "--tp", str(tp), "--gpus", str(gpus), "--strategy", strategy, "--json"]
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(argv)
    assert rc in (0, 2), err.getvalue()
    if rc == 2:
        assert err.getvalue().startswith("ftplan: error:") and err.getvalue().count("\n") == 1


def test_model_resolution_by_hub_id_and_alias():
    assert resolve_model("meta-llama/Llama-3.1-70B").name == "llama-3.1-70b"
    assert resolve_model("LLAMA-3.1-70B").name == "llama-3.1-70b"
    with pytest.raises(FtplanError) as e:
        resolve_model("llama-3.1-7b")
    assert "did you mean" in e.value.one_line() and "llama-3.1-70b" in e.value.one_line()


def test_moe_all_linear_lora_dropout_follows_peft(capsys):
    """PEFT's ParamWrapper (all-linear on fused MoE experts) refuses dropout: an unset
    --lora-dropout becomes 0 there (0.05 elsewhere); an explicit one is one-line bad input."""
    import json

    assert main(["estimate", "mixtral-8x7b", "--method", "lora", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job"]["lora"]["dropout"] == 0.0
    assert main(["estimate", "llama-3.1-8b", "--method", "lora", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job"]["lora"]["dropout"] == 0.05
    assert main(["estimate", "mixtral-8x7b", "--method", "lora", "--lora-dropout", "0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ParamWrapper" in err[0] and "--lora-dropout 0" in err[0]
    # attention-only targets keep dropout (no ParamWrapper)
    assert main(["estimate", "mixtral-8x7b", "--method", "lora", "--lora-targets", "q_proj,v_proj",
                 "--lora-dropout", "0.1"]) == 0


# FSDP1 refuses a unit of mixed dtypes, and ftplan says so (test_expert_parallel.py): with AdamW /
# SGD, whose states follow the parameter dtype, its flat shards are not held here
@pytest.mark.parametrize("engine, optimizer", [("fsdp2", o) for o in ("adamw", "adamw_8bit", "adafactor", "sgd")]
                         + [("fsdp1", o) for o in ("adamw_8bit", "adafactor")])
def test_sharded_optimizer_states_add_up_to_the_whole_with_an_fp32_router(engine, optimizer):
    """DeepSeek-V3 in pure bf16 keeps its router in fp32 (transformers >= 5.24): FSDP's optimizer
    shards over n ranks add up to the single-GPU states (to within the padding of each flat
    parameter / tensor to a multiple of n). 8-bit and Adafactor states are per element, not per
    parameter byte: counting them from the shard's bytes at the bf16 width counted every router
    element twice."""
    from ftplan.catalog.constants import memory_constants
    from ftplan.memory import model_states
    from ftplan.sharding import layout_memory

    model = resolve_model("deepseek-v3")
    assert any(g.moe is not None and g.moe.router_fp32 for g in model.groups)
    job = Job(method="full", precision="bf16", optimizer=optimizer)
    st_ = model_states(model, job)
    n = 64
    layout = Layout(gpus_per_node=8, nodes=8, strategy="fsdp", fsdp_version=int(engine[-1]))
    lm = layout_memory(model, job, layout, st_, memory_constants())
    whole = st_.optimizer_states
    # padding: < n elements per tensor (FSDP2) or flat parameter (FSDP1), at most 16 B each
    slack = 16 * n * 10_000
    assert whole - slack <= lm.optimizer_states * n <= whole + slack, (lm.optimizer_states * n - whole)
