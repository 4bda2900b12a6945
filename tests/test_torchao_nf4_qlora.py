"""QLoRA with torchao's NF4 (torchtune's QLoRA, ``quant_type="torchao-nf4"``) against torchao 0.18.

Byte-exact on CPU: what one ``linear_nf4`` call saves (the ``NF4Tensor`` only) and allocates (its
dequantize peak, ``torchao_nf4.nf4_dequant_peak_bytes``); a tiny llama with torchtune 0.3.1's QLoRA
linears (``ftplan.measure.torchtune_nf4``) against ``model_states`` and ``saved_activation_bytes``;
the FSDP2 shards torchtune's loader cuts and what ``fsdp_pre_all_gather`` sends; and, from the
gloo record of ``benchmarks/torchao_nf4_fsdp2_cpu.py`` (2 ranks, ~30 s, not run here), the per-rank
shard bytes and a decoder layer's all-gather against ``ftplan.sharding``.
"""

from __future__ import annotations

import json
import warnings
from fractions import Fraction
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.job import Job, Layout, LoraSpec, QuantSpec, validate_job
from ftplan.model import model_from_config
from ftplan.torchao_nf4 import (nf4_dequant_peak_bytes, nf4_element_bytes, nf4_problems, nf4_table_bytes,
                                nf4_tensor_bytes)

RECORD = Path(__file__).resolve().parents[1] / "benchmarks" / "measurements" / "torchao_nf4_fsdp2_cpu.json"
DOC = json.loads(RECORD.read_text())
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _tiny() -> dict:
    """The tiny llama of the gloo record: hidden 256, every linear a multiple of 16384 elements."""
    return dict(DOC["config"])


def _job(targets=("q_proj", "v_proj"), ckpt=False, batch=2, **kw) -> Job:
    return Job(loss="hf", method="qlora", precision="bf16", micro_batch=batch, seq_len=24,
               gradient_checkpointing=ckpt, attn_impl="sdpa", quant=QuantSpec(quant_type="torchao-nf4"),
               lora=LoraSpec(r=8, alpha=16, dropout=0.0, target_modules=tuple(targets)), **kw)


# ---------------------------------------------------------------------------------------------
# planning only (no torch)
# ---------------------------------------------------------------------------------------------
def test_default_quant_type_is_unchanged():
    assert QuantSpec().quant_type == "nf4" and not Job(method="qlora").torchao_nf4


def test_storage_parts_add_up():
    for n, c in ((16384, 2), (64 * 256 * 7, 2), (16384 * 3, 4)):
        assert nf4_tensor_bytes(n, c) == n * nf4_element_bytes(c) + nf4_table_bytes(c)
    assert nf4_element_bytes(2) == Fraction(4225, 8192)
    assert nf4_dequant_peak_bytes(1 << 20) == 14 * (1 << 20) + (1 << 20) // 32


def test_split_rules():
    """torchao cuts an NF4Tensor into dim-0 shards only at whole rows and whole factor blocks
    (16384 elements): 3 rows, or one factor block, over 2 ranks are refused (the record's cases)."""
    split = DOC["ranks"][0]["split"]
    assert split["2x16384"] == "" and split["3x16384"] and split["512x32"]
    assert list(nf4_problems([("a", 2, 16384)], 2)) == []
    assert len(list(nf4_problems([("a", 3, 16384), ("b", 512, 32), ("c", 7, 100)], 2))) == 3
    assert "new_empty" in DOC["ranks"][0]["fully_shard_3_rows"]  # FSDP2's own padding path fails too


def test_validation():
    spec = model_from_config(_tiny())
    validate_job(spec, _job(), Layout())
    validate_job(spec, _job(), Layout(gpus_per_node=2, strategy="fsdp"))
    bad = {
        "precision": (_job().with_(precision="bf16-mixed"), Layout()),
        "no_double_quant": (_job().with_(quant=QuantSpec(quant_type="torchao-nf4", double_quant=False)), Layout()),
        "compute_dtype": (_job().with_(precision="fp32"), Layout()),
        "strategy": (_job(), Layout(gpus_per_node=2, strategy="zero3")),
        "quant_type": (_job(), Layout(gpus_per_node=4, strategy="fsdp")),  # k_proj: 2 factor blocks
    }
    for field, (job, layout) in bad.items():
        with pytest.raises(ConfigError) as e:
            validate_job(spec, job, layout)
        assert field in {p.field for p in e.value.problems}, (field, e.value.problems)
    biased = model_from_config({**_tiny(), "model_type": "qwen2"})
    with pytest.raises(ConfigError, match="bias"):
        validate_job(biased, _job(), Layout())


def test_405b_plan_and_assumption():
    """Llama-3.1-405B as torchtune's 405B_qlora.yaml trains it on 8 GPUs: the frozen shards are the
    NF4 tensors' (about 0.5157 bytes per quantized weight) plus bf16 embedding and output, the
    gate/up projections' dequantize (53248 x 16384 elements, 14 bytes each) in the transient."""
    import ftplan

    kw = dict(method="qlora", quant_type="torchao-nf4", precision="bf16", seq_len=2048, micro_batch=2,
              loss="torchtune", lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    e = ftplan.estimate("llama-3.1-405b", gpus=8, strategy="fsdp", **kw)
    bnb = ftplan.estimate("llama-3.1-405b", gpus=8, strategy="fsdp", **{**kw, "quant_type": "nf4"})
    assert e.memory.components["frozen_weights"] < bnb.memory.components["frozen_weights"]
    assert e.memory.components["transient"] > nf4_dequant_peak_bytes(53248 * 16384)
    assert any("torchao NF4" in a.text for a in e.assumptions)


# ---------------------------------------------------------------------------------------------
# against torchao / PyTorch on CPU
# ---------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("torchao")


@pytest.mark.torch
@pytest.mark.parametrize("shape", [(256, 512, 8), (128, 256, 5)])
def test_linear_nf4_saves_the_weight_and_dequantizes_per_call(shape):
    from ftplan.measure.torchtune_nf4 import measure_linear_nf4

    out_f, in_f, tokens = shape
    r = measure_linear_nf4(out_f, in_f, tokens)
    n = out_f * in_f
    assert r.saved_weight_only and r.saved == ("NF4Tensor",)
    assert r.weight_bytes == nf4_tensor_bytes(n)
    assert r.forward_peak_bytes == nf4_dequant_peak_bytes(n) == r.backward_peak_bytes


@pytest.mark.torch
@pytest.mark.parametrize("targets,ckpt,batch", [(("q_proj", "v_proj"), False, 2)])
def test_tiny_llama_states_and_saved_exact(targets, ckpt, batch):
    """torchtune's QLoRA linears in a bf16 HF llama: frozen (NF4 + bf16), bf16 adapters, their
    gradients and AdamW states, and every saved tensor (none for the NF4 weight) exactly. More
    cases (all linears, checkpointing, other families): benchmarks/torchao_nf4_grid_cpu.py."""
    import ftplan.measure.lowprec_ref as LR
    import ftplan.measure.torchref as TR
    from ftplan.measure.torchtune_nf4 import quantize_like_torchtune
    from ftplan.memory import model_states, saved_activation_bytes

    cfg = _tiny()
    spec = model_from_config(cfg)
    job = _job(targets, ckpt, batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TR.build_model(cfg, dtype="bf16", attn_implementation="sdpa")
        quantize_like_torchtune(model, set(targets), 8, 16)
        r = LR.measure_lowprec_step(model, batch=batch, seq_len=24, gradient_checkpointing=ckpt, autocast_dtype=None)
    st = model_states(spec, job)
    assert (r.frozen_param_bytes, r.trainable_param_bytes, r.grad_bytes, r.optimizer_state_bytes) == \
        (st.frozen_weights, st.trainable_weights, st.gradients, st.optimizer_states)
    assert r.weight_copy_bytes == st.master_weights == 0
    assert r.saved_bytes == saved_activation_bytes(spec, job, backend="cpu")


@pytest.mark.torch
@pytest.mark.parametrize("shape", [(256, 512, 2), (1024, 256, 4), (2, 32768, 2)])
def test_fsdp2_shard_and_all_gather_input(shape):
    """torchtune's loader (chunk, new_zeros, copy_) and ``fsdp_pre_all_gather`` on the shard: each
    rank keeps n / W elements' codes, scalers and factors plus its own tables, and sends the first
    three (no padding: torchao refuses uneven splits)."""
    from ftplan.measure.torchtune_nf4 import fsdp2_shard_bytes

    out_f, in_f, world = shape
    n = out_f * in_f
    for rank in fsdp2_shard_bytes(out_f, in_f, world):
        assert rank["all_gather_input_bytes"] == n // world * nf4_element_bytes()
        assert rank["shard_bytes"] == rank["all_gather_input_bytes"] + nf4_table_bytes()


def test_fsdp2_gloo_record_matches_sharding():
    """The 2-rank gloo run (torch 2.13, torchao 0.18): every rank's frozen and trainable shard bytes
    are ftplan's FSDP2 ones, and a decoder layer's all-gather (NF4 codes + scalers + factors, bf16
    norms and adapters, one uint8 buffer) is the sum of its unit's tensors."""
    from ftplan.memory import model_states
    from ftplan.sharding import fsdp_units, layout_memory
    from ftplan.catalog.constants import memory_constants

    spec = model_from_config(_tiny())
    job = _job(DOC["targets"], True, DOC["batch"]).with_(seq_len=DOC["seq_len"])
    job = job.with_(lora=LoraSpec(r=DOC["lora_r"], alpha=DOC["lora_alpha"], dropout=0.0,
                                  target_modules=tuple(DOC["targets"])))
    layout = Layout(gpus_per_node=DOC["world"], strategy="fsdp")
    lm = layout_memory(spec, job, layout, model_states(spec, job), memory_constants())
    layer = next(u for u in fsdp_units(spec, job, "fsdp2") if u.name.startswith("layer"))
    gathered = sum(t.padded(DOC["world"]) * t.nbytes for t in layer.tensors)
    for r in DOC["ranks"]:
        assert r["ok"], r
        assert r["frozen_shard_bytes"] == lm.frozen_weights
        assert r["trainable_shard_bytes"] == lm.trainable_weights == r["grad_shard_bytes"] == lm.gradients
        assert r["forward_gathers"][1:] == [gathered] * spec.num_layers
