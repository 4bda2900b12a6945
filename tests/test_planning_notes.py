"""Notes that explain what an answer plans (or does not): LoRA-on-experts activations, dropout.

PEFT's ParamWrapper (all-linear on a transformers-5 MoE) builds the merged expert weights
``W + BA`` in every forward and grouped_mm saves them: ``3 E h I`` weight-dtype bytes per MoE layer
(held byte-exact against PyTorch in tests/test_moe_qlora_activations.py and
tests/test_memory_vs_torch.py). Without checkpointing they dominate the activations; the answer
must say so and name the two single changes that remove them.
"""

from __future__ import annotations

import dataclasses

import pytest
from ftplan.catalog.models import resolve_model
from ftplan.job import Job, Layout, LoraSpec
from ftplan.memory import estimate_memory


def _notes(model: str, **job) -> list[str]:
    base = Job(method="lora", gradient_checkpointing=False, lora=LoraSpec(dropout=0.0))
    return [n for n in estimate_memory(resolve_model(model), dataclasses.replace(base, **job), Layout()).notes
            if n.startswith("LoRA on the experts")]


def test_mixtral_without_checkpointing_names_the_merged_experts():
    (note,) = _notes("mixtral-8x7b")
    per_layer = 8 * 3 * 4096 * 14336 * 2  # E x (gate, up, down) x h x I x bf16
    assert f"{per_layer / 2**30:,.2f} GiB per MoE layer" in note
    assert f"{32 * per_layer / 2**30:,.1f} GiB over 32 layers" in note
    assert "`gradient_checkpointing`" in note and "`lora_targets=" in note


@pytest.mark.parametrize("change", [
    {"gradient_checkpointing": True},
    {"lora": LoraSpec(dropout=0.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))},
])
def test_no_note_when_the_experts_are_not_kept(change):
    assert _notes("mixtral-8x7b", **change) == []


def test_no_note_for_a_dense_model():
    assert _notes("llama-3.1-8b") == []


def test_attention_dropout_of_a_family_that_does_not_plan_it_is_named():
    """llama's attention passes config.attention_dropout to the kernel in training, as seed_oss's
    does (which ftplan plans); elsewhere the answer must say it is planned as 0."""
    from ftplan.model import model_from_config

    cfg = dict(resolve_model("llama-3.1-8b").config, attention_dropout=0.1)
    notes = estimate_memory(model_from_config(cfg), Job(), Layout()).notes
    assert any(n.startswith("config attention_dropout 0.1 is planned as 0") for n in notes)
    assert not any("attention_dropout" in n for n in estimate_memory(resolve_model("llama-3.1-8b"), Job(),
                                                                     Layout()).notes)


def test_the_hints_name_the_models_own_attention_linears():
    """The single change "leave the experts frozen" names the model's own attention linears (MLA's
    q_a_proj ... on DeepSeek-V3, not llama's q_proj), and the suggested targets validate."""
    from ftplan.errors import ConfigError
    from ftplan.job import validate_job

    mla = "q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj"
    (note,) = _notes("deepseek-v3")
    assert f"`lora_targets={mla}` leaves the experts frozen" in note
    (note,) = _notes("mixtral-8x7b")
    assert "`lora_targets=q_proj,k_proj,v_proj,o_proj` leaves the experts frozen" in note
    model = resolve_model("deepseek-v3")
    with pytest.raises(ConfigError) as e:
        validate_job(model, Job(method="lora", lora=LoraSpec(dropout=0.05)), Layout())
    assert f"`lora_targets={mla}`" in str(e.value.problems[0].hint)
    validate_job(model, Job(method="lora", lora=LoraSpec(dropout=0.05, target_modules=tuple(mla.split(",")))),
                 Layout())
