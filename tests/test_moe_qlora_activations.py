"""QLoRA saved activations on MoE families without activation checkpointing, byte-exact on CPU.

bitsandbytes packs only ``nn.Linear`` weights: transformers 5's fused 3-D experts (and the router)
stay in the load dtype, and PEFT's recipe (``prepare_model_for_kbit_training``) upcasts them to
fp32. What autograd keeps, per recipe (the tiny configs of ``ftplan.measure.configs``, 2 x 24
tokens, lora_dropout 0 as PEFT's ParamWrapper on the experts requires):

* PEFT's recipe: ParamWrapper's merged ``W + BA`` of the fp32 experts is fp32 (type promotion over
  the bf16 delta), and on CPU ``grouped_mm`` runs in it and saves it (``3 E h I`` x 4 bytes per
  MoE layer; on CUDA autocast's bf16 copy, unchanged). bitsandbytes' 4-bit linears return fp32
  here, so MLA's ``kv_a_layernorm`` keeps kv_a's whole fp32 output (its rope part too), CPU's
  flash sdpa gets autocast copies of q, k, v (v no longer a view of kv_b_proj's output), and the
  shared-expert gate's sigmoid is fp32.
* TRL's recipe (bf16 adapters, no kbit upcast): without dropout the adapters read the layer's own
  bf16 tensors on MoE layers too (one storage for q/k/v, o_proj's is the attention kernel's), and
  the wrapped router's ``get_delta_weight`` upcasts the bf16 adapters on CPU: autocast's bf16
  recasts of A and B are saved.

Measured side: the saved storages less autocast's copies of PEFT's fp32 adapters (``param_copy``:
counted with the weights, ``ModelStates.master_weights``); ParamWrapper's merged router weight
is an activation (it is a ``TBackward0`` tensor but no parameter's copy).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("bitsandbytes")

from ftplan.memory import model_states, saved_activation_bytes  # noqa: E402

pytestmark = pytest.mark.torch


def _measured(r, recipe: str) -> int:
    casts = sum(x.nbytes for x in r.records if x.param_copy) if recipe == "peft" else 0
    return r.saved_activation_bytes - casts


#: one case per mechanism (by hand, every MoE tiny family and both recipes hold too: mixtral,
#: qwen3_moe, qwen3_next, qwen3_5_moe, minimax_m2, deepseek_v3, glm4_moe, glm4_moe_lite, mistral4,
#: gpt_oss, gemma4_moe, lfm2_moe, llama4_text; and with checkpointing)
@pytest.mark.parametrize("family,recipe", [
    ("mixtral", "trl"),  # softmax router, fused experts: shared adapter inputs, router delta copies
    ("minimax_m2", "peft"),  # fp32 merged experts (sigmoid router with fp32 correction bias)
    ("qwen3_next", "peft"),  # DeltaNet + shared expert with its 4-bit sigmoid gate
    ("deepseek_v3", "peft"),  # MLA (CPU math sdpa), fp32 router, shared experts
    ("glm4_moe_lite", "peft"),  # MLA (CPU flash sdpa)
])
def test_saved_activations_exact_qlora_moe_no_checkpointing(family, recipe):
    from test_memory_vs_torch import _run_qlora

    spec, job, r = _run_qlora(family, False, recipe, dropout=0.0)
    assert saved_activation_bytes(spec, job, backend="cpu") == _measured(r, recipe)
    st = model_states(spec, job)
    assert (st.frozen_weights, st.trainable_weights, st.gradients) == (
        r.frozen_param_bytes, r.trainable_param_bytes, r.grad_bytes)


def test_odd_partial_rotary_width():
    """An odd rotary width (head_dim 16 x partial_rotary_factor 0.3125 = 5): transformers' cos/sin
    tables are ``2 * ceil(5 / 2) = 6`` wide (``arange(0, dim, 2)`` frequencies, doubled) and the
    rotation covers 6 features; parameters do not depend on it."""
    import ftplan.measure.torchref as TR
    from test_memory_vs_torch import _run

    rope = {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.3125}
    cfg = {k: v for k, v in {**TR.TINY_CONFIGS["minimax_m2"], "head_dim": 16, "rotary_dim": None,
                             "rope_parameters": rope}.items() if v is not None}
    spec, job, r, casts = _run("minimax_m2", "full", False, 2, 24, cfg=cfg)
    assert spec.attention.rotary_dim == 5
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts
    assert spec.params.total * 4 == r.param_bytes
