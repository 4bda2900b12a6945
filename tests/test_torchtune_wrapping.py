"""torchtune's own FSDP2 wrapping (``Layout.fsdp_wrap="torchtune"``) against real distributed PyTorch.

torchtune 0.3.1's ``training.shard_model`` (recipes ``full_finetune_distributed`` with
``custom_sharded_layers: ['tok_embeddings', 'output']`` and ``lora_finetune_distributed``): decoder
layers (full: also the embedding and the output projection) are units, the root holds the rest and
stays gathered; the output unit is called once per loss chunk. ``benchmarks/torchtune_wrap_cpu.py``
runs 7 cases on 2 gloo ranks (a tiny HF llama wrapped in torchtune's unit structure: full / LoRA,
CPU offload, no reshard, 7 or 8 chunks) and records the per-rank bytes in
``benchmarks/measurements/torchtune_wrap_cpu.json``: every one must equal ``layout_memory``'s (CPU
form). One case, the 70B full row's recipe (full, CPU offload, 8 chunks), is re-measured live in
tests/test_distributed_memory.py's 2-rank process group (no spawn of its own when that file ran).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.job import Job, Layout, LoraSpec, validate_job
from ftplan.model import model_from_config
from ftplan.sharding import fsdp_units, torchtune_output_calls

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

DOC = json.loads((ROOT / "benchmarks" / "measurements" / "torchtune_wrap_cpu.json").read_text())

_LLAMA = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 120,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "tie_word_embeddings": False}


def _job(method: str, seq_len: int = 32, **kw) -> Job:
    kw.setdefault("gradient_checkpointing", False)
    return Job(method=method, precision="bf16", loss="torchtune", seq_len=seq_len,
               lora=LoraSpec(r=8, alpha=16, dropout=0.0, target_modules=("q_proj", "k_proj", "v_proj")), **kw)


def test_units_follow_torchtunes_recipes():
    spec = model_from_config(_LLAMA)
    full = fsdp_units(spec, _job("full"), wrap="torchtune")
    assert [u.name for u in full] == ["root", "embed", "layer0", "output"]
    root, embed, layer, output = full
    assert [t.numel for t in root.tensors] == [64] and not root.reshard_after_forward  # the final norm
    assert embed.reshard_after_forward and output.reshard_after_forward and layer.count == 2
    assert output.calls == 8 and embed.calls == 1
    lora = fsdp_units(spec, _job("lora"), wrap="torchtune")
    assert [u.name for u in lora] == ["root", "layer0"]
    # the LoRA recipe shards only the layers: embedding, norm and output are the root's
    assert [t.numel for t in lora[0].tensors] == [512 * 64, 64, 512 * 64] and not lora[0].reshard_after_forward
    assert lora[0].numel(True) == 0
    # the default (accelerate's units) is unchanged
    assert fsdp_units(spec, _job("full")) == fsdp_units(spec, _job("full"), wrap="accelerate")


@pytest.mark.parametrize("seq_len,calls", [(2048, 8), (32, 8), (20, 7), (9, 5), (5, 5), (1, 1)])
def test_output_calls_are_torch_chunk_counts(seq_len, calls):
    # torch.chunk(8): ceil(s / 8) positions per chunk, so s = 20 gives 7 chunks of 3 and 2
    assert torchtune_output_calls(_job("full", seq_len)) == calls
    assert torchtune_output_calls(dataclasses.replace(_job("full", seq_len), loss="hf", precision="bf16")) == 1


def test_recorded_gloo_runs_equal_the_formula():
    """Every case of benchmarks/torchtune_wrap_cpu.py, every rank: parameters, gradients, AdamW
    states, host bytes (offload) and FSDP2's transient peak, byte for byte."""
    import torchtune_wrap_cpu as B

    assert len(DOC["records"]) == len(B.CASES)
    for rec in DOC["records"]:
        case = B.case_of(rec)
        p = _predicted_no_torch(case)
        for m in rec["ranks"]:
            measured = dict(m)
            if case.offload_params:
                measured.update(params=0, grads=0, optimizer=0)
            assert measured == {"params": p["params"], "grads": p["grads"], "optimizer": p["optimizer"],
                                "host": p["host"], "engine_transient_peak": p["transient"]}, case.label


def _predicted_no_torch(case) -> dict[str, int]:
    from ftplan.catalog.constants import memory_constants
    from ftplan.memory import model_states
    from ftplan.sharding import layout_memory

    consts = dataclasses.replace(memory_constants(), fsdp2_schedule_torch=2.13)  # the records' torch
    spec = model_from_config(_LLAMA)
    job, layout = case.job(), case.layout(2)
    lm = layout_memory(spec, job, layout, model_states(spec, job), consts, "cpu")
    out = {"params": lm.frozen_weights + lm.trainable_weights, "grads": lm.gradients,
           "optimizer": lm.optimizer_states, "host": lm.host,
           "transient": max(lm.transient, lm.forward_transient or 0)}
    assert all(Fraction(v).denominator == 1 for v in out.values())
    return {k: int(v) for k, v in out.items()}


def test_ci_case_measured_live():
    """The 70B full row's recipe (full, CPU offload, 8 output chunks) on 2 gloo ranks, now."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torchtune_wrap_cpu as B
    from test_distributed_memory import TORCHTUNE_WRAP_CASES, TWO_RANK_RESULTS

    assert TORCHTUNE_WRAP_CASES == [B.CI_CASE]
    if B.CI_CASE in TWO_RANK_RESULTS:
        res = TWO_RANK_RESULTS[B.CI_CASE]
    else:  # run on its own (about 25 s on 2 loaded cores)
        from ftplan.measure.distributed import run_cases

        res = run_cases([B.CI_CASE], 2, timeout_s=600)[0]
    assert not isinstance(res, str), res
    bad = B.check(B.CI_CASE, res)
    assert not bad, "\n".join(bad)


def test_validation_names_the_field():
    spec = model_from_config(_LLAMA)
    for layout in (Layout(2, 1, "zero3", fsdp_wrap="torchtune"),
                   Layout(2, 1, "fsdp", fsdp_version=1, fsdp_wrap="torchtune"),
                   Layout(4, 1, "fsdp", tp=2, fsdp_wrap="torchtune"),
                   Layout(2, 2, "fsdp", hsdp=True, fsdp_wrap="torchtune"),
                   Layout(2, 1, "fsdp", fsdp_wrap="megatron")):
        with pytest.raises(ConfigError) as e:
            validate_job(spec, _job("full"), layout)
        assert any(p.field == "fsdp_wrap" for p in e.value.problems)
    tied = model_from_config({**_LLAMA, "tie_word_embeddings": True})
    with pytest.raises(ConfigError) as e:
        validate_job(tied, _job("full"), Layout(2, 1, "fsdp", fsdp_wrap="torchtune"))
    assert "untied" in str(e.value)
    validate_job(spec, _job("lora"), Layout(2, 1, "fsdp", fsdp_wrap="torchtune"))


def test_estimate_states_the_wrapping_and_export_refuses_it():
    import ftplan
    from ftplan.export.targets import exportable

    est = ftplan.estimate("llama-3.1-70b", method="full", precision="bf16", loss="torchtune", seq_len=2048,
                          micro_batch=2, gpus=8, strategy="fsdp", offload_params=True, offload_optimizer=True,
                          fsdp_wrap="torchtune")
    doc = est.to_dict()
    assert any(a["field"] == "fsdp_wrap" for a in doc["assumptions"])
    assert any("torchtune's units" in n for n in doc["notes"])
    ok, why = exportable(Layout(8, 1, "fsdp", fsdp_wrap="torchtune"), _job("full"))
    assert not ok and "`fsdp_wrap`" in why


def test_lora_forward_peak_is_placed_at_the_forward_start():
    """The LoRA root (embedding, norm, output) is gathered first and its all-gather output is still
    held at the first layer's copy-out: the engine's forward peak, counted beside what the forward
    has saved by then (nothing of the layers), not beside every saved activation."""
    from ftplan.catalog.models import resolve_model
    from ftplan.memory import estimate_memory

    spec = resolve_model("llama-3.1-70b")
    job = _job("lora", 2048, micro_batch=2, gradient_checkpointing=True)
    tt = Layout(8, 1, "fsdp", fsdp_wrap="torchtune")
    from ftplan.catalog.constants import memory_constants
    from ftplan.memory import model_states
    from ftplan.sharding import layout_memory

    lm = layout_memory(spec, job, tt, model_states(spec, job), memory_constants())
    root = (2 * 128256 * 8192 + 8192) * 2  # embedding, norm, output in bf16
    assert lm.forward_layers_done == 0 and lm.forward_transient > 2 * root > lm.transient
    mem = estimate_memory(spec, job, tt)
    # summed with every saved activation the forward peak would exceed the backward moment
    assert mem.peak_allocated_bytes < int(lm.frozen_weights + lm.trainable_weights + lm.gradients
                                          + lm.optimizer_states + lm.forward_transient) + mem.components["activations"]


def test_the_two_70b_rows_are_scored():
    import published_multi_gpu as P

    ids = ("torchtune-llama3.1-70b-full-offload", "torchtune-llama3.1-70b-lora")
    rows = [r for r in P.load_rows() if r["id"] in ids]
    assert len(rows) == 2
    for p in P.points(rows):
        assert p.error_pct is not None and P.job_and_layout(p.row)[1].fsdp_wrap == "torchtune"
    # the 405B QLoRA row: torchao NF4 (quant_type torchao-nf4) under the same wrapping, scored too
    nf4 = [r for r in P.load_rows() if r["id"] == "torchtune-llama3.1-405b-qlora"]
    (p,) = P.points(nf4)
    assert not nf4[0]["depends_on"] and p.error_pct is not None
    job, layout = P.job_and_layout(p.row)
    assert layout.fsdp_wrap == "torchtune" and job.quant.quant_type == "torchao-nf4"
