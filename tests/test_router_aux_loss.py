"""``output_router_logits``: the load-balancing loss of transformers' MoE ``ForCausalLM`` forwards.

With ``output_router_logits`` set, the forward of 11 families (:data:`ftplan.model.
ROUTER_AUX_LOSS_FAMILIES`) adds ``load_balancing_loss_func`` over every MoE layer's router
logits, concatenated: its softmax (``moe_layers x tokens x experts`` in the logits' dtype) is
saved until backward, outside the layers (checkpointing keeps it), plus the fp32
tokens-per-expert vector (4 E bytes). Held
against PyTorch on CPU with the generic harness of tests/test_memory_vs_torch.py (HF Trainer
autocast, pure bf16; full and LoRA; checkpointing on and off). The other MoE families compute no
such loss (0 B measured). Until 2026-11-25 ftplan ignored the flag (qwen2_moe refused it).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import ftplan.measure.torchref as TR  # noqa: E402
from ftplan.memory import saved_activation_bytes  # noqa: E402
from ftplan.model import ROUTER_AUX_LOSS_FAMILIES, model_from_config  # noqa: E402

from test_memory_vs_torch import _run  # noqa: E402


@pytest.mark.parametrize("family,method,ckpt,precision", [
    ("mixtral", "full", False, "bf16-mixed"),
    ("mixtral", "lora", True, "bf16-mixed"),
    ("qwen3_moe", "full", True, "bf16"),
    ("granitemoe", "full", False, "bf16-mixed"),  # fp32 router logits (``.float()``)
    ("ernie4_5_moe", "full", False, "bf16"),  # the autocast-off fp32 router
    ("qwen2_moe", "full", False, "bf16-mixed"),  # one MoE layer of two
    ("minimax_m2", "full", False, "bf16-mixed"),  # 8 experts
])
def test_load_balancing_loss_saved_exact(family, method, ckpt, precision):
    cfg = {**TR.TINY_CONFIGS[family], "output_router_logits": True}
    spec, job, r, casts = _run(family, method, ckpt, 2, 24, precision=precision, cfg=cfg)
    assert spec.router_aux_loss
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts
    off = model_from_config(TR.TINY_CONFIGS[family])
    moe_layers = sum(g.count for g in spec.groups if g.moe is not None)
    experts = next(g.moe.num_experts for g in spec.groups if g.moe is not None)
    fp32_logits = family in ("granitemoe", "ernie4_5_moe")
    logits = 4 if fp32_logits else 2
    assert (saved_activation_bytes(spec, job, backend="cpu") - saved_activation_bytes(off, job, backend="cpu")
            == moe_layers * 2 * 24 * experts * logits + 4 * experts)
    # CUDA autocast runs the softmax in fp32
    if precision == "bf16-mixed" and not fp32_logits:
        assert (saved_activation_bytes(spec, job, backend="cuda") - saved_activation_bytes(off, job, backend="cuda")
                == moe_layers * 2 * 24 * experts * 4 + 4 * experts)


def test_families_without_the_loss_ignore_the_flag():
    for family in ("deepseek_v3", "glm4_moe", "dots1"):
        spec = model_from_config({**TR.TINY_CONFIGS[family], "output_router_logits": True})
        assert family not in ROUTER_AUX_LOSS_FAMILIES and not spec.router_aux_loss
