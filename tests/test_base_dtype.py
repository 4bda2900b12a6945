"""``Job.base_dtype``: a LoRA base loaded in fp32 (TRL SFTTrainer's default for a model id).

The byte-exact checks against PyTorch live with the other formulas (tests/test_memory_vs_torch.py
``*_fp32_base``, tests/test_loss_peak_vs_torch.py ``mixed-lora-fp32-base``, the gloo cases
``base-fp32`` in tests/test_distributed_memory.py); here: what the option is allowed with, what
it changes and what it leaves alone, end to end.
"""

from __future__ import annotations

import pytest

from ftplan.catalog.gpus import get_gpu
from ftplan.catalog.models import get_model
from ftplan.cli import main
from ftplan.errors import ConfigError
from ftplan.export.script import render_train_script
from ftplan.job import Job, Layout, LoraSpec, validate_job
from ftplan.memory import estimate_memory
from ftplan.runtime import estimate_runtime

DENSE = get_model("llama-3.1-8b").spec()
MOE = get_model("mixtral-8x7b").spec()
LORA = Job(method="lora")
FP32 = LORA.with_(base_dtype="fp32")


@pytest.mark.parametrize("job, layout, words", [
    (Job(method="full", base_dtype="fp32"), Layout(), "the trained weights follow the precision"),
    (Job(method="qlora", base_dtype="fp32"), Layout(), "the base is quantized"),
    (FP32.with_(precision="bf16"), Layout(), "needs a mixed precision"),
    (FP32.with_(precision="fp8"), Layout(), "needs a mixed precision"),
    (FP32.with_(activation_offloading=True), Layout(), "activation offloading is not modelled"),
])
def test_refused_where_it_means_nothing_or_is_not_modelled(job, layout, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        validate_job(DENSE, job, layout)


def test_moe_expert_lora_over_an_fp32_base_is_refused_unsharded_only():
    with pytest.raises(ConfigError, match="fused experts"):
        validate_job(MOE, FP32.with_(lora=LoraSpec(dropout=0.0)), Layout())
    # sharded: FSDP gathers (DeepSpeed casts) the base in bf16, nothing of autocast's is involved
    validate_job(MOE, FP32.with_(lora=LoraSpec(dropout=0.0)), Layout(gpus_per_node=8, strategy="fsdp"))
    validate_job(MOE, FP32.with_(lora=LoraSpec(target_modules=("q_proj",))), Layout())


def test_cli_bad_combination_is_one_line_and_exit_2(capsys):
    rc = main(["estimate", "llama-3.1-8b", "--method", "full", "--base-dtype", "fp32"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "base_dtype" in err and "Traceback" not in err


def test_one_gpu_doubles_the_frozen_weights_and_adds_one_layers_copies():
    a, b = estimate_memory(DENSE, LORA), estimate_memory(DENSE, FP32)
    c = a.components
    assert b.components["frozen_weights"] == 2 * c["frozen_weights"]
    # checkpointing: the recomputed layer's frozen matmul weights in bf16, transient
    layer = sum(lin.in_features * lin.out_features for lin in DENSE.linears() if lin.module != "lm_head") \
        // DENSE.num_layers
    assert b.components["transient"] - c["transient"] >= 2 * layer
    assert b.components["activations"] > c["activations"]  # the fp32 residual stream's layer inputs


@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_sharded_runs_on_compute_dtype_weights(strategy):
    lay = Layout(gpus_per_node=8, strategy=strategy)
    a, b = estimate_memory(DENSE, LORA, lay), estimate_memory(DENSE, FP32, lay)
    assert b.components["activations"] == a.components["activations"]
    if strategy == "fsdp":  # the fp32 shards stay fp32
        assert b.components["frozen_weights"] > 1.9 * a.components["frozen_weights"]
    else:  # DeepSpeed's bf16 mode casts the module
        assert b.components["frozen_weights"] == a.components["frozen_weights"]


def test_runtime_gathers_in_the_compute_dtype_and_casts_on_one_gpu():
    gpu = get_gpu("h100-sxm")
    lay = Layout(gpus_per_node=8, strategy="fsdp")
    assert estimate_runtime(DENSE, FP32, lay, gpu).step_time_s == pytest.approx(
        estimate_runtime(DENSE, LORA, lay, gpu).step_time_s, rel=1e-9)
    one_a, one_b = estimate_runtime(DENSE, LORA, Layout(), gpu), estimate_runtime(DENSE, FP32, Layout(), gpu)
    assert one_a.dequant_time_s == 0 and one_b.dequant_time_s > 0
    assert one_b.compute_time_s > one_a.compute_time_s  # (micro-batch 1 is host-bound: step time alike)


def test_export_loads_the_base_in_fp32():
    script = render_train_script(DENSE, FP32, Layout(), model_ref="meta-llama/Llama-3.1-8B")
    assert "MODEL_DTYPE = 'float32'" in script
    assert "MODEL_DTYPE = 'bfloat16'" in render_train_script(DENSE, LORA, Layout(), model_ref="x")


def test_the_default_is_printed_with_the_option_to_change_it(capsys):
    assert main(["estimate", "llama-3.1-8b", "--method", "lora"]) == 0
    out = capsys.readouterr().out
    assert "frozen base loaded in bf16" in out and "--base-dtype fp32" in out
    assert main(["estimate", "llama-3.1-8b", "--method", "lora", "--base-dtype", "fp32"]) == 0
    assert "base loaded in fp32" in capsys.readouterr().out


def test_a_campaign_builds_the_fp32_base_separately():
    """``ftplan measure --matrix`` shares one built model between rows with the same build key:
    an fp32-loaded base is another model."""
    from ftplan.measure.run import build_key

    assert build_key("llama-3.2-1b", LORA, "cuda", False) != build_key("llama-3.2-1b", FP32, "cuda", False)
