"""Routed experts held in fp32 run their GEMMs in fp32 (runtime.fp32_expert_gemms).

The physics: transformers 5.24's MoE experts call ``torch._grouped_mm`` (or
``torch.nn.functional.grouped_mm``) on ``input.to(weight.dtype)``, and ``_grouped_mm`` has no
autocast kernel (pytorch#174763), so an fp32 expert weight makes an fp32 GEMM under bf16
autocast -- checked here on the dispatcher and by running it. On CUDA a non-bf16 grouped_mm takes
torch's fallback (a loop of ``mm``, cuBLAS SGEMM with ``allow_tf32=False``), which ftplan prices
at the GPU's FP32 peak: not measured (no GPU), the rate is the datasheet's (gpus.csv).
"""

from __future__ import annotations

import pytest

from ftplan.catalog.gpus import get_gpu
from ftplan.catalog.models import resolve_model
from ftplan.job import Job, Layout, LoraSpec, QuantSpec
from ftplan.runtime import estimate_runtime, fp32_expert_gemms, fp32_experts_note

NOTE = "routed experts run their GEMMs in fp32"


def test_grouped_mm_has_no_autocast_kernel():
    torch = pytest.importorskip("torch")
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for key in ("AutocastCUDA", "AutocastCPU"):
        assert has("aten::mm", key) and has("aten::bmm", key)  # (Llama 4's experts: bmm, autocast)
        assert not has("aten::_grouped_mm", key)
    # and so it runs in its operands' dtype under autocast, where mm is cast down
    x, w = torch.randn(6, 8), torch.randn(2, 8, 4)
    offs = torch.tensor([2, 6], dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch._grouped_mm(x, w, offs=offs).dtype == torch.float32
        assert torch.mm(x, w[0]).dtype == torch.bfloat16


def test_transformers_experts_run_in_the_weight_dtype():
    """transformers' ``_grouped_mm`` casts the input to the weight's dtype: fp32 experts compute
    in fp32 under bf16 autocast, bf16 ones in bf16."""
    torch = pytest.importorskip("torch")
    moe = pytest.importorskip("transformers.integrations.moe")
    x = torch.randn(6, 16, dtype=torch.bfloat16)
    offs = torch.tensor([2, 6], dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert moe._grouped_mm(x, torch.randn(2, 16, 8), offs).dtype == torch.float32
        assert moe._grouped_mm(x.float(), torch.randn(2, 16, 8, dtype=torch.bfloat16), offs).dtype == torch.bfloat16


def _rt(model, job, layout=Layout(), gpu="h100-sxm"):
    return estimate_runtime(model, job, layout, get_gpu(gpu))


def test_fp32_expert_gemms_at_the_fp32_rate():
    """PEFT's QLoRA recipe vs TRL's on Mixtral (the GEMM profile is the same; only the experts'
    dtype differs): the experts' GEMM time grows by the GPU's bf16 / FP32 peak ratio (large,
    compute-bound GEMMs: within 2 %), everything else in the GEMM term is unchanged."""
    m = resolve_model("mixtral-8x7b")
    g = get_gpu("h100-sxm")
    job = Job(method="qlora", micro_batch=8, seq_len=4096)
    trl_job = job.with_(quant=QuantSpec(recipe="trl"))
    assert fp32_expert_gemms(m, job, Layout()) and not fp32_expert_gemms(m, trl_job, Layout())
    peft, trl = _rt(m, job), _rt(m, trl_job)
    fp32 = peft.breakdown["fp32_expert_matmul_s"]
    assert trl.breakdown["fp32_expert_matmul_s"] == 0 and fp32 > 0
    rest = peft.breakdown["matmul_s"] - fp32  # the non-expert GEMMs, at the bf16 rate in both
    bf16_experts = trl.breakdown["matmul_s"] - rest
    assert 0 < bf16_experts < trl.breakdown["matmul_s"]
    assert fp32 / bf16_experts == pytest.approx(g.peak_tflops("bf16") / g.peak_tflops("fp32"), rel=0.02)
    assert peft.step_time_s > trl.step_time_s


@pytest.mark.parametrize("name, job, layout", [
    ("llama-3.1-8b", Job(method="full"), Layout()),  # dense: no experts
    ("llama-3.1-8b", Job(method="qlora"), Layout()),
    ("qwen3-30b-a3b", Job(method="full"), Layout(gpus_per_node=8, strategy="fsdp")),  # FSDP: bf16 params
    ("qwen3-30b-a3b", Job(method="full"), Layout(gpus_per_node=8, strategy="zero2")),  # DeepSpeed bf16 mode
    ("qwen3-30b-a3b", Job(method="full", precision="bf16"), Layout()),  # pure bf16
    ("qwen3-30b-a3b", Job(method="lora"), Layout()),  # bf16 base
    ("qwen3-30b-a3b", Job(method="qlora", quant=QuantSpec(recipe="trl")), Layout()),
    ("llama-4-scout", Job(method="qlora"), Layout()),  # bmm experts: autocast covers them
])
def test_no_fp32_experts(name, job, layout):
    m = resolve_model(name)
    assert not fp32_expert_gemms(m, job, layout)
    assert fp32_experts_note(m, job, layout) is None
    assert _rt(m, job, layout, "h200").breakdown["fp32_expert_matmul_s"] == 0


@pytest.mark.parametrize("job, layout", [
    (Job(method="qlora"), Layout()),
    (Job(method="full"), Layout(gpus_per_node=8, strategy="ddp")),
    (Job(method="full", precision="fp16-mixed"), Layout()),
    (Job(method="lora", base_dtype="fp32", lora=LoraSpec(target_modules=("q_proj", "v_proj"))), Layout()),
])
def test_fp32_experts_agree_with_the_memory_dtypes(job, layout):
    """The runtime's rule is the memory model's expert activation dtype (``_act_dtypes``) on one
    GPU / DDP: fp32 experts exactly where their saved activations are fp32."""
    from ftplan.memory import _act_dtypes

    m = resolve_model("qwen3-30b-a3b")
    assert fp32_expert_gemms(m, job, layout)
    assert _act_dtypes(job, "cuda").expert == 4
    for other in (Job(method="qlora", quant=QuantSpec(recipe="trl")), Job(method="lora"), Job(method="full", precision="bf16")):
        assert _act_dtypes(other, "cuda").expert == 2 and not fp32_expert_gemms(m, other, layout)


def test_note_on_the_answer():
    """The estimate says so in one line, with the fix; not under TRL's recipe."""
    import ftplan

    est = ftplan.estimate("qwen3-30b-a3b", method="qlora", gpu="h100-sxm")
    notes = [n for n in est.runtime_notes if NOTE in n]
    assert len(notes) == 1 and "\n" not in notes[0]
    assert "qlora_recipe" in notes[0] and "s of the" in notes[0]
    est = ftplan.estimate("qwen3-30b-a3b", method="qlora", qlora_recipe="trl", gpu="h100-sxm")
    assert not [n for n in est.runtime_notes if NOTE in n]
    note = fp32_experts_note(resolve_model("gpt-oss-20b"), Job(method="full"), Layout(gpus_per_node=8, strategy="ddp"),
                             get_gpu("h100-sxm"))
    assert note is not None and "strategy=fsdp" in note and "precision=bf16" in note
