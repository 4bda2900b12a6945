"""Tests of the measurement harness itself (ftplan.measure.torchref) against hand-computed values.

These check the *measuring instrument*, not ftplan's formulas: saved-tensor counting on plain torch
modules where the answer is known by hand, optimizer-state accounting, checkpoint handling, and a
smoke test of every tiny Hugging Face family. CPU only; the whole file runs in well under a minute.
"""

from __future__ import annotations

import functools
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from ftplan.measure import torchref as tr  # noqa: E402

pytestmark = pytest.mark.torch

B, S, IN, OUT = 2, 8, 16, 24
F32 = 4


def _x(requires_grad: bool = False) -> torch.Tensor:
    return torch.randn(B, S, IN, requires_grad=requires_grad)


# ------------------------------------------------------------------------------------------------
# saved-tensor hooks on plain modules
# ------------------------------------------------------------------------------------------------


def test_linear_relu_saves_input_and_relu_output_params_excluded():
    torch.manual_seed(0)
    lin = nn.Linear(IN, OUT)
    x = _x(requires_grad=True)  # makes addmm save weight.t() too (a view of a parameter)
    with tr.SavedTensorTracker(lin) as t:
        y = torch.relu(lin(x))
    recs = t.alive_records()
    by_op = t.by_op()
    assert by_op["linear"] == B * S * IN * F32  # the input, once
    assert by_op["relu"] == B * S * OUT * F32  # relu saves its result
    assert t.saved_bytes() == B * S * (IN + OUT) * F32
    # the parameter (saved as weight.t(), a view of the parameter storage) is excluded ...
    assert t.excluded_bytes() == IN * OUT * F32
    # ... and no record points at a parameter storage
    pkeys = {tr.storage_key(p) for p in lin.parameters()}
    assert not pkeys & {r.key for r in recs}
    del y


def test_input_without_grad_linear_only_saves_input():
    lin = nn.Linear(IN, OUT)
    x = _x(requires_grad=False)
    with tr.SavedTensorTracker(lin) as t:
        y = lin(x)
    assert t.saved_bytes() == B * S * IN * F32
    assert t.excluded_bytes() == 0  # weight not needed: no grad wrt x
    del y


def test_shared_storage_counted_once_with_full_size():
    l1, l2 = nn.Linear(IN, OUT), nn.Linear(IN, OUT)
    model = nn.ModuleList([l1, l2])
    x = _x()
    with tr.SavedTensorTracker(model) as t:
        a = l1(x)  # saves x
        b = l2(x)  # saves x again: same storage
        c = l1(x[:1])  # a (contiguous) view of x: same storage, counted once at full size
    recs = t.alive_records()
    assert len(recs) == 1
    assert recs[0].nbytes == B * S * IN * F32
    assert recs[0].n_saves == 3
    del a, b, c


def test_frozen_params_and_buffers_are_excluded():
    lin = nn.Linear(IN, OUT)
    lin.weight.requires_grad_(False)
    lin.register_buffer("scale", torch.randn(OUT))
    x = _x(requires_grad=True)
    with tr.SavedTensorTracker(lin) as t:
        y = lin(x) * lin.scale  # mul saves the buffer (for grad wrt lin(x)): excluded
    assert t.saved_bytes() == 0
    assert t.excluded_bytes() == IN * OUT * F32 + OUT * F32
    del y


def test_a_storage_a_parameter_left_during_the_forward_is_an_activation():
    """bitsandbytes' Linear4bit replaces its bias' ``.data`` (a cast to the input dtype) on its
    first call: the old address is free, and a saved activation the allocator puts there is an
    activation, not the parameter (it was, now and then, on a loaded machine)."""
    lin = nn.Linear(IN, OUT)
    old = lin.bias.data
    a = torch.randn(OUT, requires_grad=True)
    with tr.SavedTensorTracker(lin) as t:
        lin.bias.data = old.to(torch.bfloat16)  # what Linear4bit.forward does to its bias
        y = a * old  # mul saves `old` (for the gradient of `a`): at the bias' former address
        z = a * lin.bias  # the bias where it is now: still excluded
    assert t.saved_bytes() == OUT * F32 + OUT * F32  # `old`, and `a` (saved by the second mul)
    assert t.excluded_bytes() == OUT * 2
    del y, z


def test_dropped_subgraph_is_not_counted():
    lin = nn.Linear(IN, OUT)
    x = _x()
    with tr.SavedTensorTracker(lin) as t:
        kept = torch.relu(lin(x))
        dropped = torch.sigmoid(lin(x) * 2.0)  # sigmoid saves its result
        del dropped
    assert t.by_op() == {"linear": B * S * IN * F32, "relu": B * S * OUT * F32}
    del kept


def test_reused_address_of_released_save_starts_a_fresh_record():
    lin = nn.Linear(IN, OUT)
    x = _x()
    with tr.SavedTensorTracker(lin) as t:
        for _ in range(3):  # released saves: the allocator is free to hand the addresses out again
            tmp = torch.sigmoid(lin(x).double())
            del tmp
        kept = torch.relu(torch.randn(B, S, 2 * OUT, requires_grad=True) * 1.0)
    assert t.by_op() == {"relu": B * S * 2 * OUT * F32}
    assert all(not r.alive for r in t.retired)
    del kept


def test_autocast_weight_copies_are_activations_and_named():
    lin = nn.Linear(IN, OUT)
    x = _x(requires_grad=True)  # so that the (cast) weight is needed for the input gradient
    with tr.SavedTensorTracker(lin) as t, torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    recs = {r.param_copy: r for r in t.alive_records()}
    assert recs["weight"].nbytes == IN * OUT * 2  # the bf16 copy of the fp32 weight is kept for backward
    assert recs[""].nbytes == B * S * IN * 2  # the bf16 copy of the input
    assert t.excluded_bytes() == 0
    del y


def test_attribution_by_module_and_op():
    model = nn.Sequential(nn.Linear(IN, OUT), nn.ReLU())
    with tr.SavedTensorTracker(model) as t:
        y = model(_x())
    mods = {r.module: r.op for r in t.alive_records()}
    assert mods == {"0": "linear", "1": "relu"}
    del y


# ------------------------------------------------------------------------------------------------
# checkpointing
# ------------------------------------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(IN, OUT)
        self.b = nn.Linear(OUT, IN)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if mask is not None:
            h = h * mask
        return self.b(h)


def test_nonreentrant_checkpoint_counts_only_its_input():
    blk = _Block()
    x = _x(requires_grad=True)
    with tr.SavedTensorTracker(blk) as t:
        y = checkpoint(blk, x, use_reentrant=False)
    recs = t.alive_records()
    assert [r.op for r in recs] == ["checkpoint_input"] or [r.op for r in recs] == ["<python>"]
    assert t.saved_bytes() == B * S * IN * F32
    y.sum().backward()  # the hooks stay usable for the recompute
    assert x.grad is not None


def test_checkpoint_closure_tensors_counted_via_wrapper():
    blk = _Block()
    x = _x(requires_grad=True)
    mask = torch.ones(1, S, OUT)
    with tr.SavedTensorTracker(blk) as t:
        ckpt = t.wrap_checkpoint_fn(functools.partial(checkpoint, use_reentrant=False))
        y = ckpt(functools.partial(blk.forward, mask=mask), x)
    ops = sorted(r.op for r in t.alive_records())
    assert ops == ["checkpoint_closure", "checkpoint_input"]
    assert t.saved_bytes() == B * S * IN * F32 + S * OUT * F32
    assert t.n_checkpoint_calls == 1
    assert t.rng_state_bytes == torch.get_rng_state().numel()
    y.sum().backward()


def test_reentrant_checkpoint_counts_its_input():
    blk = _Block()
    x = _x(requires_grad=True)
    with tr.SavedTensorTracker(blk) as t:
        y = checkpoint(blk, x, use_reentrant=True)
    assert t.saved_bytes() == B * S * IN * F32
    y.sum().backward()


def test_uncheckpointed_block_saves_more():
    blk = _Block()
    x = _x(requires_grad=True)
    with tr.SavedTensorTracker(blk) as t:
        y = blk(x)
    # x (input of a) + relu output (input of b, shared storage)
    assert t.saved_bytes() == B * S * IN * F32 + B * S * OUT * F32
    del y


# ------------------------------------------------------------------------------------------------
# optimizer state
# ------------------------------------------------------------------------------------------------


def _one_step(name: str, module: nn.Module) -> torch.optim.Optimizer:
    opt = tr.make_optimizer(name, list(module.parameters()))
    module(torch.randn(4, IN)).sum().backward()
    opt.step()
    return opt


def test_adamw_state_bytes():
    lin = nn.Linear(IN, OUT)
    opt = _one_step("adamw", lin)
    total, by_key, _ = tr.optimizer_state_bytes(opt)
    numel = IN * OUT + OUT
    assert total == 2 * numel * F32 + 4 * 2  # exp_avg + exp_avg_sq + one fp32 `step` per tensor
    assert by_key == {"exp_avg": numel * F32, "exp_avg_sq": numel * F32, "step": 8}


def test_sgd_momentum_state_bytes():
    lin = nn.Linear(IN, OUT)
    opt = _one_step("sgd", lin)
    total, by_key, _ = tr.optimizer_state_bytes(opt)
    assert total == (IN * OUT + OUT) * F32
    assert set(by_key) == {"momentum_buffer"}


def test_adafactor_state_is_factored():
    lin = nn.Linear(IN, OUT)
    opt = _one_step("adafactor", lin)
    total, by_key, _ = tr.optimizer_state_bytes(opt)
    # 2-D weight: row (OUT) + col (IN) second moments; 1-D bias: full second moment (OUT);
    # plus a 0-dim fp32 `RMS` tensor per parameter (`step` is a Python int)
    assert total == (OUT + IN + OUT) * F32 + 2 * F32
    assert by_key == {
        "exp_avg_sq_row": OUT * F32,
        "exp_avg_sq_col": IN * F32,
        "exp_avg_sq": OUT * F32,
        "RMS": 2 * F32,
    }


def test_adamw_8bit_runs_on_cpu_with_blockwise_state():
    pytest.importorskip("bitsandbytes")
    lin = nn.Linear(64, 80)  # 5120 elements >= 4096: 8-bit state; bias (80) stays 32-bit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = _one_step_wide("adamw_8bit", lin)
    total, by_key, per_param = tr.optimizer_state_bytes(opt)
    w_state = opt.state[lin.weight]
    assert w_state["state1"].dtype == torch.uint8 and w_state["state1"].numel() == 5120
    assert opt.state[lin.bias]["state1"].dtype == torch.float32
    n_blocks = -(-5120 // 256)
    expected = 2 * 5120 + 2 * n_blocks * 4 + 2 * 256 * 4 + 2 * 80 * 4  # states, absmax, qmaps, fp32 bias
    assert total == expected


def _one_step_wide(name: str, lin: nn.Linear) -> torch.optim.Optimizer:
    opt = tr.make_optimizer(name, list(lin.parameters()))
    lin(torch.randn(4, lin.in_features)).sum().backward()
    opt.step()
    return opt


# ------------------------------------------------------------------------------------------------
# Hugging Face families
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(tr.TINY_CONFIGS))
def test_every_family_builds_and_categories_sum(family):
    model = tr.build_model(tr.TINY_CONFIGS[family])
    cats = tr.params_by_category(model)
    assert set(cats) == set(tr.CATEGORIES)
    # (ernie4_5_moe: its routers' e_score_correction_bias Parameters are frozen)
    frozen = sum(p.numel() for n, p in model.named_parameters() if n.endswith("e_score_correction_bias"))
    assert sum(cats.values()) == tr.total_params(model) == tr.trainable_params(model) + frozen
    assert cats["embedding"] == 512 * 64
    assert cats["norms"] > 0 and cats["attention"] > 0
    cfg = tr.TINY_CONFIGS[family]
    assert (cats["lm_head"] == 0) == bool(cfg.get("tie_word_embeddings"))
    if family in ("deepseek_v2", "phimoe"):  # (session 17, famb: MoE families)
        assert cats["experts"] > 0 and cats["router"] > 0
        return
    moe = family in ("mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "glm4_moe", "qwen3_5_moe", "qwen3_next", "llama4_text",
                      "gemma4_moe", "glm4_moe_lite", "mistral4", "minimax_m2", "lfm2_moe",
                      "granitemoe", "olmoe", "dots1", "ernie4_5_moe", "qwen2_moe")
    assert (cats["experts"] > 0) == moe and (cats["router"] > 0) == moe


def test_meta_device_counts_match_cpu():
    cfg = tr.TINY_CONFIGS["deepseek_v3"]
    meta = tr.build_model(cfg, device="meta")
    assert next(meta.parameters()).device.type == "meta"
    assert tr.params_by_category(meta) == tr.params_by_category(tr.build_model(cfg))


def test_gemma3_multimodal_config_builds_text_model():
    model = tr.build_model({"model_type": "gemma3", "text_config": dict(tr.TINY_CONFIGS["gemma3_text"])})
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert tr.total_params(model) == tr.total_params(tr.build_model(tr.TINY_CONFIGS["gemma3_text"]))


def test_measure_step_full_finetune_llama():
    model = tr.build_model(tr.TINY_CONFIGS["llama"], attn_implementation="sdpa")
    m0 = tr.measure_step(model, batch=2, seq_len=32, gradient_checkpointing=False)
    m1 = tr.measure_step(model, batch=2, seq_len=32, gradient_checkpointing=True)
    n_tensors = len(list(model.parameters()))
    for m in (m0, m1):
        assert m.param_bytes == tr.total_params(model) * F32
        assert m.grad_bytes == m.trainable_param_bytes == m.param_bytes
        assert m.frozen_param_bytes == 0
        assert m.n_trainable_tensors == n_tensors
        assert m.optimizer_state_bytes == 2 * m.param_bytes + 4 * n_tensors
        assert m.saved_activation_bytes == sum(m.saved_by_kind.values())
        # the fp32 log-softmax of the loss: b*s*V*4, and the int64 input ids
        assert m.saved_by_kind["cross_entropy"] >= 2 * 32 * 512 * F32
    assert m1.checkpoint_calls == 2 and m0.checkpoint_calls == 0
    assert m1.saved_activation_bytes < m0.saved_activation_bytes
    # checkpointed: each layer keeps only its hidden-state input (b*s*h fp32)
    assert m1.saved_by_kind["checkpoint_input"] == 2 * (2 * 32 * 64 * F32)


def test_hooks_match_profiler_exactly_up_to_loss_and_scalars():
    model = tr.build_model(tr.TINY_CONFIGS["qwen2"], attn_implementation="eager")
    for gc in (False, True):
        lb = tr.live_bytes_after_forward(model, batch=2, seq_len=32, gradient_checkpointing=gc)
        assert lb.saved_not_live == {}
        expl = lb.explain()
        assert expl.get("other", 0) == 0
        assert expl["loss"] == 4
        assert expl.get("checkpoint_rng_state", 0) == (2 * 5056 if gc else 0)
        assert lb.live_bytes == lb.hook_saved_bytes + sum(expl.values())


def test_lora_targets_dense_family():
    model = tr.build_model(tr.TINY_CONFIGS["phi3"])
    la = tr.apply_lora(model, r=8, alpha=16, dropout=0.0, target_modules="all-linear")
    assert la.targeted_suffixes == ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"]
    assert la.untargeted_linear == ["lm_head"]
    assert la.targeted_parameters == []
    assert tr.trainable_params(la.model) == la.lora_params == tr.params_by_category(la.model)["lora"]


def test_lora_all_linear_on_v5_moe_reaches_experts_and_router():
    model = tr.build_model(tr.TINY_CONFIGS["mixtral"])
    la = tr.apply_lora(model, r=8, alpha=16, dropout=0.0, target_modules="all-linear")
    assert la.targeted_suffixes == ["k_proj", "o_proj", "q_proj", "v_proj"]
    suffixes = {p.rsplit(".", 1)[-1] for p in la.targeted_parameters}
    assert suffixes == {"gate_up_proj", "down_proj", "weight"}  # experts + router gate.weight
    with pytest.raises(ValueError, match="lora_dropout"):
        tr.apply_lora(tr.build_model(tr.TINY_CONFIGS["mixtral"]), r=8, alpha=16, dropout=0.1)


def test_lora_with_checkpointing_measures():
    model = tr.build_model(tr.TINY_CONFIGS["llama"], attn_implementation="sdpa")
    la = tr.apply_lora(model, r=8, alpha=16, dropout=0.1, target_modules="all-linear")
    m = tr.measure_step(la.model, batch=2, seq_len=32, gradient_checkpointing=True)
    assert m.trainable_param_bytes == la.lora_params * F32 == m.grad_bytes
    assert m.saved_by_kind["checkpoint_input"] == 2 * (2 * 32 * 64 * F32)
    assert m.loss == m.loss  # not NaN


def test_lora_on_bf16_model_keeps_fp32_adapters_and_fp32_input_copies():
    model = tr.build_model(tr.TINY_CONFIGS["llama"], dtype="bf16", attn_implementation="sdpa")
    la = tr.apply_lora(model, r=8, alpha=16, dropout=0.0, target_modules="all-linear")
    m = tr.measure_step(la.model, batch=2, seq_len=32, gradient_checkpointing=False, forward_only=True)
    assert m.trainable_param_bytes == la.lora_params * F32
    lora_in = [r for r in m.records if r.module.endswith("lora_A.default")]
    assert lora_in and all(r.dtype == "float32" for r in lora_in)
    # q, k and v each keep their own fp32 copy of the (shared, bf16) normed input in layer 1
    qkv = [
        r
        for r in lora_in
        if ".layers.1.self_attn." in r.module and r.module.split(".")[-3] in ("q_proj", "k_proj", "v_proj")
    ]
    assert len(qkv) == 3 and len({r.key for r in qkv}) == 3


def test_qlora_nf4_runs_on_cpu_and_counts_quant_state():
    pytest.importorskip("bitsandbytes")
    model = tr.build_model(tr.TINY_CONFIGS["llama"], dtype="bf16", quantization="nf4", attn_implementation="sdpa")
    q_proj = model.model.layers[0].self_attn.q_proj
    assert type(q_proj).__name__ == "Linear4bit"
    assert tr.total_params(model) == tr.total_params(tr.build_model(tr.TINY_CONFIGS["llama"]))
    assert len([mod for mod in model.modules() if type(mod).__name__ == "Linear4bit"]) == 7 * 2
    la = tr.apply_lora(model, r=8, alpha=16, dropout=0.0, target_modules="all-linear")
    m = tr.measure_step(la.model, batch=2, seq_len=32, gradient_checkpointing=True)
    # packed 4-bit weights are half a byte per element; absmax/code are reported and included
    assert m.quant_state_bytes > 0
    assert m.trainable_param_bytes == la.lora_params * F32  # PEFT upcasts adapters to fp32
    assert m.grad_bytes == m.trainable_param_bytes
    assert m.loss == m.loss
