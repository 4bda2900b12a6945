"""Checks every per-family test file (``tests/test_<family>.py``) runs, written once.

Each function asserts what the family files asserted inline before (same comparisons, same
exactness); a family file calls them with its own family, config and cases. Also used by the
by-hand harnesses under ``benchmarks/`` (``by_hand.py``), which put ``tests/`` on ``sys.path``.

* :func:`meta_params`: transformers' parameters by category, built on the meta device;
* :func:`meta_model`: transformers' causal LM of a config object on the meta device;
* :func:`assert_defaults_are`: every default ftplan fills in for a family equals the config class's;
* :func:`check_variant`: saved activations of one real step against the plan, byte-exact;
* :func:`variants_test`: the parametrized test of a family file's ``VARIANTS`` (the CI cases);
* :func:`check_qlora`, :func:`check_moe_qlora`: one bitsandbytes QLoRA step against the plan;
* :func:`check_checkpointing_variant`: a checkpointing mode (SAC, every-k, ...) against one real step;
* :func:`peft_all_linear_trainables`: the trainable parameter names of PEFT's ``all-linear``;
* :func:`assert_refused`: configs ftplan refuses, each in one line;
* :func:`validate_ep_layouts`: expert parallelism planned (full on ep=2, attention LoRA on ep=4);
* :func:`check_ep_ranks`: a 2-rank gloo expert-parallel run's per-rank states and MoE saved bytes.
"""

from __future__ import annotations

import warnings

import pytest

from ftplan.errors import ConfigError
from ftplan.job import Job, Layout, LoraSpec, validate_job
from ftplan.model import FAMILIES, model_from_config

#: PEFT's LoRA on the attention projections (LoRA on EP experts is refused: tests/test_ep_lora.py)
ATTENTION_LORA = LoraSpec(dropout=0.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))


def meta_params(cfg: dict) -> dict[str, int]:
    """transformers' parameters by category, built on the meta device from ``cfg``."""
    from ftplan.measure.accounting import params_by_category
    from ftplan.measure.hf import build_model

    return params_by_category(build_model(cfg, device="meta"))


def meta_model(tfc):
    """``AutoModelForCausalLM.from_config(tfc)`` on the meta device, its warnings silenced."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(tfc)


def assert_defaults_are(family: str, tfc, *, absent=(), skip=(), kv_heads_are_heads: bool = False) -> None:
    """Every default ftplan fills in for ``family`` equals the config object ``tfc``'s, except:
    ``absent`` keys are no fields of it (``None`` there and in ftplan's defaults), ``skip`` keys are
    left to the caller (filled in by ``__post_init__`` or checked otherwise), and with
    ``kv_heads_are_heads`` ftplan's ``num_key_value_heads`` is None and the config class's
    ``__post_init__`` fills in the attention heads."""
    for key, value in FAMILIES[family].defaults.items():
        if key in absent:
            assert getattr(tfc, key, None) is None and value is None, key
        elif kv_heads_are_heads and key == "num_key_value_heads":
            assert value is None and tfc.num_key_value_heads == tfc.num_attention_heads
        elif key not in skip:
            assert getattr(tfc, key) == value, key


def check_variant(family: str, method, ckpt, batch, seq, attn, extra) -> None:
    """Saved activations of one real step of the tiny ``family`` with config changes ``extra``
    equal ftplan's (less the parameter copies the harness counts as casts), byte-exact."""
    import ftplan.measure.torchref as TR
    from ftplan.memory import saved_activation_bytes
    from test_memory_vs_torch import _run

    cfg = {**TR.TINY_CONFIGS[family], **extra}
    spec, job, r, casts = _run(family, method, ckpt, batch, seq, attn=attn, cfg=cfg)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


def check_qlora(family: str, recipe: str, ckpt: bool) -> None:
    """test_memory_vs_torch's QLoRA check (``recipe``: PEFT's or TRL's) of the tiny ``family``."""
    from test_memory_vs_torch import _check_qlora

    _check_qlora(family, ckpt, recipe)


def check_moe_qlora(family: str, recipe: str, ckpt: bool) -> None:
    """One QLoRA step against the plan, lora_dropout 0: without checkpointing measured as
    tests/test_moe_qlora_activations.py does (ParamWrapper's merged router weight is an
    activation, not a parameter's copy), with it as test_memory_vs_torch's ``_check_qlora``."""
    from test_memory_vs_torch import _check_qlora, _run_qlora

    from ftplan.memory import model_states, saved_activation_bytes

    if ckpt:
        _check_qlora(family, ckpt, recipe, dropout=0.0)
        return
    spec, job, r = _run_qlora(family, False, recipe, dropout=0.0)
    casts = sum(x.nbytes for x in r.records if x.param_copy) if recipe == "peft" else 0
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts
    st = model_states(spec, job)
    assert (st.frozen_weights, st.trainable_weights, st.gradients, st.optimizer_states) == (
        r.frozen_param_bytes, r.trainable_param_bytes, r.grad_bytes, r.optimizer_state_bytes)


def check_checkpointing_variant(family: str, method: str, mode: str, loss: str = "hf") -> None:
    """tests/test_checkpointing_vs_torch.py's measurement of checkpointing ``mode`` (b 2 x 24
    tokens): saved bytes (less the weight copies) and the SAC cache equal ftplan's, byte-exact."""
    import test_checkpointing_vs_torch as C

    from ftplan.memory import activation_parts, saved_activation_bytes

    spec, r = C._measure(family, method, mode, loss=loss)
    job = C._job(family, method, mode, 2, 24, loss)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.device_bytes - r.weight_copy_bytes
    assert activation_parts(spec, job, backend="cpu").sac_cache_bytes == r.sac_cache_bytes


def variants_test(check, variants):
    """A test of the ``(method, checkpointing, batch, seq, attention, config changes)`` cases
    ``variants``, each through ``check`` (the family's ``check_variant``), marked ``torch``: a
    family file assigns it to ``test_saved_activations_exact_variants``."""

    @pytest.mark.torch
    @pytest.mark.parametrize("method,ckpt,batch,seq,attn,extra", variants)
    def test(method, ckpt, batch, seq, attn, extra):
        check(method, ckpt, batch, seq, attn, extra)

    return test


def peft_all_linear_model(cfg: dict, lora_dropout: float = 0.0):
    """PEFT's LoRA (r 8, alpha 16) with ``target_modules="all-linear"`` on the bf16 model of ``cfg``,
    PEFT's warnings silenced."""
    from peft import LoraConfig, get_peft_model

    import ftplan.measure.torchref as TR

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_peft_model(TR.build_model(cfg, dtype="bf16"),
                              LoraConfig(r=8, lora_alpha=16, lora_dropout=lora_dropout,
                                         target_modules="all-linear", task_type="CAUSAL_LM"))


def peft_all_linear_trainables(cfg: dict, lora_dropout: float = 0.0) -> set[str]:
    """The names of the trainable parameters of :func:`peft_all_linear_model`."""
    model = peft_all_linear_model(cfg, lora_dropout)
    return {n for n, p in model.named_parameters() if p.requires_grad}


def assert_wraps_experts_and_router(names: set[str]) -> None:
    """PEFT's ``all-linear`` adapted the fused experts and the router (ParamWrapper)."""
    assert any("mlp.experts" in n and "lora_A" in n for n in names)
    assert any("mlp.gate" in n and "lora_A" in n for n in names)


def assert_refused(cfg: dict, cases) -> None:
    """Each ``(config changes, message)`` of ``cases`` on ``cfg`` raises a one-line ConfigError
    matching the message."""
    for extra, msg in cases:
        with pytest.raises(ConfigError, match=msg) as e:
            model_from_config({**cfg, **extra})
        assert "\n" not in str(e.value)


def validate_ep_layouts(spec) -> None:
    """Expert parallelism is planned: full fine-tuning on FSDP x ep=2, LoRA on the attention on ep=4."""
    validate_job(spec, Job(method="full"), Layout(2, 1, "fsdp", ep=2))
    validate_job(spec, Job(method="lora", lora=ATTENTION_LORA), Layout(4, 1, "fsdp", ep=4))


def check_ep_ranks(family: str, ranks, *, one_row_less: int = 0) -> None:
    """The ranks of a 2-rank expert-parallel gloo run (``ftplan.measure.ep_run.run_ep``, full
    fine-tuning, bf16, batch 2 x 32 tokens) of the tiny ``family`` against ftplan: local experts,
    parameters and gradients per rank exact, optimizer states within a 4-byte step per tensor,
    every MoE block's saved bytes given the rows the rank received, and every routed row on one
    rank. ``one_row_less``: elements of a (1, hidden) tensor FSDP2 puts whole on rank 0 (qwen2_moe's
    shared_expert_gate), which the other ranks hold exactly less of (bf16 weight and gradient, two
    bf16 AdamW states); ftplan's per-rank figure is rank 0's."""
    import ftplan.measure.torchref as TR
    from ftplan.memory import estimate_memory, moe_block_saved_bytes

    assert not isinstance(ranks, str), ranks
    cfg = TR.TINY_CONFIGS[family]
    model = model_from_config(cfg)
    job = Job(method="full", precision="bf16", micro_batch=2, seq_len=32)
    mem = estimate_memory(model, job, Layout(2, 1, "fsdp", ep=2))
    moe = next(g.moe for g in model.groups if g.moe is not None)
    n_tensors = sum(1 for _ in TR.build_model(cfg, device="meta").parameters())
    for rank, r in enumerate(ranks):
        less = one_row_less if rank > 0 else 0
        assert r.local_experts == moe.num_experts // 2
        # states per rank: the experts split by EP, the rest by FSDP (exact)
        assert r.param_bytes == mem.components["trainable_weights"] - 2 * less, (r.param_bytes, rank)
        assert r.grad_bytes == mem.components["gradients"] - 2 * less, (r.grad_bytes, rank)
        # AdamW: every rank keeps a 4-byte step per tensor, the formula shards them with the rest
        assert 0 <= r.optimizer_bytes + 4 * less - mem.components["optimizer_states"] <= 4 * n_tensors
        # each MoE block, given the rows this rank received
        assert len(r.moe_saved) == len(r.rows) > 0
        for rows, saved in zip(r.rows, r.moe_saved):
            assert moe_block_saved_bytes(model, job, ep=2, ep_rows=rows, backend="cpu") == saved
    # all-to-all conservation: every routed (token, expert) row lands on exactly one rank
    for layer in range(len(ranks[0].rows)):
        assert sum(r.rows[layer] for r in ranks) == sum(r.tokens for r in ranks) * moe.top_k
