"""Architectures without an sdpa path in transformers are planned with the attention transformers
runs: Gemma2 (attention soft-capping, ``_supports_sdpa = False``) refuses
``attn_implementation="sdpa"`` (seen on the H100: the three gemma2 rows of
``benchmarks/measurements/h100-sxm-holdout1.jsonl`` are that error) and runs eager attention by
default, whose (b, heads, s, s) scores ftplan must count (``h100-sxm-eager1.jsonl``: gemma-2-2b
LoRA at 4 x 2048 tokens measured 9.31 GiB peak allocated)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ftplan.catalog.gpus import get_gpu
from ftplan.catalog.models import resolve_model
from ftplan.job import Job, Layout, LoraSpec, planned_attention
from ftplan.memory import estimate_memory
from ftplan.runtime import estimate_runtime

ROOT = Path(__file__).resolve().parents[1]


def test_gemma2_has_no_sdpa_path_and_gemma3_and_llama_do():
    assert not resolve_model("gemma-2-2b").supports_sdpa
    assert resolve_model("gemma-3-27b").supports_sdpa
    assert resolve_model("llama-3.1-8b").supports_sdpa


def test_the_default_gemma2_job_is_planned_eager_and_says_so():
    spec = resolve_model("gemma-2-2b")
    job = Job(method="lora", micro_batch=4, seq_len=2048)
    assert job.attn_impl == "sdpa"
    planned, note = planned_attention(spec, job)
    assert planned.attn_impl == "eager" and "eager" in note
    default = estimate_memory(spec, job)
    eager = estimate_memory(spec, job.with_(attn_impl="eager"))
    assert default.peak_allocated_bytes == eager.peak_allocated_bytes
    assert any("no sdpa path" in n for n in default.notes)
    gpu = get_gpu("h100-sxm")
    assert (estimate_runtime(spec, job, Layout(), gpu).step_time_s
            == estimate_runtime(spec, job.with_(attn_impl="eager"), Layout(), gpu).step_time_s)
    # flash stays flash; other architectures keep sdpa
    assert planned_attention(spec, job.with_(attn_impl="flash"))[0].attn_impl == "flash"
    assert planned_attention(resolve_model("llama-3.1-8b"), job) == (job, None)


def test_the_measured_gemma2_run_is_what_the_default_job_predicts():
    rec = next(json.loads(line) for line in (ROOT / "benchmarks/measurements/h100-sxm-eager1.jsonl").open()
               if '"gemma-2-2b"' in line and '"method":"lora"' in line)
    measured = rec["measured"]["peak_allocated_bytes"]
    spec = resolve_model("gemma-2-2b")
    job = Job(method="lora", micro_batch=4, seq_len=2048)  # attention left at its default
    predicted = estimate_memory(spec, job).peak_allocated_bytes
    assert 0 <= (predicted - measured) / measured <= 0.05


def test_every_answer_names_the_attention_it_plans():
    """The estimate's job line and a search's assumptions say eager for gemma2, sdpa for llama."""
    import contextlib
    import io

    from ftplan.cli import main

    def run(*argv):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            main(list(argv))
        return buf.getvalue()

    est = run("estimate", "gemma-2-2b", "--method", "lora", "--gpu", "h100-sxm")
    assert "attention eager" in est.splitlines()[1]
    assert "attention sdpa" in run("estimate", "llama-3.2-1b", "--method", "lora").splitlines()[1]
    rec = run("recommend", "gemma-2-2b", "--method", "lora", "--tokens", "10M")
    assert "attention: eager" in rec and "attention: sdpa" not in rec
    doc = json.loads(run("recommend", "gemma-2-2b", "--method", "lora", "--tokens", "10M", "--json"))
    assert {a["value"] for a in doc["assumptions"] if a["field"] == "attn_impl"} == {"eager"}


def test_gpt_oss_has_no_sdpa_path_and_is_planned_eager_with_its_sinks():
    """gpt-oss joins a learned sink logit per head to every softmax row; transformers has no sdpa
    path for it (``GptOssPreTrainedModel._supports_sdpa = False``) and runs eager by default, the
    attention the OpenAI cookbook's fine-tuning recipe names (``attn_implementation="eager"``)."""
    spec = resolve_model("gpt-oss-20b")
    assert not spec.supports_sdpa and spec.attention.sinks
    job = Job(method="lora", micro_batch=1, seq_len=2048)
    planned, note = planned_attention(spec, job)
    assert planned.attn_impl == "eager" and "attention sinks (gpt-oss)" in note
    assert "vllm-flash-attn3" in note
    # the eager scores over s + 1 columns (the sink) dominate the activations at long sequences:
    # they grow with s^2 while flash attention's saved tensors grow with s
    short, long = (estimate_memory(spec, job.with_(seq_len=n)) for n in (2048, 8192))
    flash_short, flash_long = (estimate_memory(spec, job.with_(seq_len=n, attn_impl="flash")) for n in (2048, 8192))
    eager_growth = long.peak_allocated_bytes - short.peak_allocated_bytes
    flash_growth = flash_long.peak_allocated_bytes - flash_short.peak_allocated_bytes
    assert eager_growth > 3 * flash_growth


def test_transformers_refuses_sdpa_for_gpt_oss():
    """The fact behind ``supports_sdpa`` read from the installed transformers (skipped without it)."""
    import pytest

    pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssPreTrainedModel

    assert GptOssPreTrainedModel._supports_sdpa is False


def test_gpt_oss_answer_says_its_mxfp4_checkpoint_is_planned_in_bf16():
    notes = estimate_memory(resolve_model("gpt-oss-20b"), Job(method="lora")).notes
    assert any("MXFP4" in n and "dequantize=True" in n for n in notes)
    assert not any("MXFP4" in n for n in estimate_memory(resolve_model("llama-3.1-8b"), Job(method="lora")).notes)


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2"])
def test_fp8_checkpoints_say_they_are_planned_dequantized(name):
    """DeepSeek-V3 and Kimi K2 ship 128x128-block FP8 weights (quantization_config quant_method fp8):
    the answer says the plan is on the dequantized bf16 weights, and for QLoRA that it needs a bf16 copy."""
    layout = Layout(gpus_per_node=8, strategy="fsdp")
    lora = estimate_memory(resolve_model(name), Job(method="lora", lora=LoraSpec(dropout=0.0)), layout).notes
    qlora = estimate_memory(resolve_model(name), Job(method="qlora", lora=LoraSpec(dropout=0.0)), layout).notes
    assert any("FP8" in n and "dequantize=True" in n and "QLoRA" not in n for n in lora)
    assert any("FP8" in n and "bf16 copy" in n for n in qlora)
    assert not any("block-scaled FP8" in n for n in estimate_memory(resolve_model("qwen3-30b-a3b"),
                                                                   Job(method="lora", lora=LoraSpec(dropout=0.0))).notes)
