"""FSDP2's per-rank forward/backward peak walked moment by moment (``sharding.fsdp2_moment_peak``,
used by ``memory.estimate_memory`` for FSDP2) against real distributed PyTorch.

``benchmarks/fsdp2_moment_peak_cpu.py`` runs 15 cases on 2 gloo ranks (tiny llama / qwen2 / mixtral;
full and LoRA; checkpointing on and off; accelerate's units and torchtune's, ``Layout.fsdp_wrap``;
reshard after forward off; CPU offload) and records each rank's ``fwd_bwd_peak`` (every byte the
rank holds at the peak of its forward and backward) in ``benchmarks/measurements/fsdp2_moment_peak_cpu.json``.
``estimate_memory(..., backend="cpu")``'s peak, without what a CPU run has not (cuBLAS workspace,
the optimizer states of a first step), must give each case's expectation
(``fsdp2_moment_peak_cpu.expectation``): byte-exact for 7 of them, else a stated bound. Two cases
are re-measured live: tests/test_distributed_memory.py's 2-rank process group runs them anyway
(untied llama under accelerate's units; torchtune's 70B full recipe), so CI adds no spawn when
that file ran in the session.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from ftplan.catalog.constants import memory_constants
from ftplan.job import Job, Layout, LoraSpec
from ftplan.memory import estimate_memory, model_states
from ftplan.model import model_from_config
from ftplan.sharding import ActivationSchedule, fsdp2_moment_peak, fsdp2_transient_bytes, fsdp_units, layout_memory

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

DOC = json.loads((ROOT / "benchmarks" / "measurements" / "fsdp2_moment_peak_cpu.json").read_text())

_LLAMA = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 120,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "tie_word_embeddings": False}


def _bench():
    import fsdp2_moment_peak_cpu as B

    if not B.TORCH_VERSION:
        B.TORCH_VERSION.append(float(".".join(DOC["torch"].split("+")[0].split(".")[:2])))
    return B


def test_recorded_gloo_runs_hold():
    """Every recorded case, every rank, as ``expectation`` says (no torch needed)."""
    B = _bench()
    assert len(DOC["records"]) == len(B.CASES)
    kinds = []
    for rec in DOC["records"]:
        case = B.case_of(rec)
        kinds.append(B.expectation(case)[0])
        for r in rec["ranks"]:
            assert not B.check_rank(case, r), B.check_rank(case, r)
    assert kinds.count("exact") == 7


def test_two_cases_measured_live():
    """Untied llama (accelerate's units: byte-exact) and torchtune's 70B full recipe (a bound), now."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ftplan.measure.distributed import Case

    B = _bench()
    cases = [Case(family="llama", engine="fsdp2"),
             Case(family="llama", engine="fsdp2", method="full", fsdp_wrap="torchtune", seq_len=24,
                  offload_params=True)]
    try:
        from test_distributed_memory import TWO_RANK_RESULTS
    except Exception:  # (collected alone)
        TWO_RANK_RESULTS = {}
    missing = [c for c in cases if c not in TWO_RANK_RESULTS]
    results = dict(TWO_RANK_RESULTS)
    if missing:  # run on their own (about 30 s on 2 loaded cores)
        from ftplan.measure.distributed import run_cases

        results.update(zip(missing, run_cases(missing, 2, timeout_s=600)))
    for case in cases:
        res = results[case]
        assert not isinstance(res, str), res
        assert [B.expectation(case)[0] for _ in res] == ["exact" if case.fsdp_wrap == "accelerate" else "over"] * 2
        bad = [why for m in res if (why := B.check_rank(case, B.record(case, [m])["ranks"][0]))]
        assert not bad, bad


def _job(method: str, **kw) -> Job:
    kw.setdefault("gradient_checkpointing", False)
    return Job(method=method, precision=kw.pop("precision", "bf16-mixed"), seq_len=32, micro_batch=2,
               lora=LoraSpec(r=8, alpha=16, dropout=0.0), **kw)


@pytest.mark.parametrize("wrap,method,precision,loss,offload,reshard,hsdp", [
    ("accelerate", "full", "bf16-mixed", "hf", False, True, False),
    ("accelerate", "lora", "bf16-mixed", "hf", False, False, False),
    ("accelerate", "full", "bf16-mixed", "hf", True, True, False),
    ("accelerate", "full", "bf16-mixed", "hf", False, True, True),
    ("torchtune", "full", "bf16", "torchtune", True, True, False),
    ("torchtune", "lora", "bf16", "torchtune", False, True, False)])
def test_walk_without_activations_is_the_engines_transient(wrap, method, precision, loss, offload, reshard, hsdp):
    """With no activations and no kept gradients the moment walk is ``fsdp2_transient_bytes``."""
    for tied in (False, True):
        if tied and wrap == "torchtune":
            continue
        spec = model_from_config({**_LLAMA, "tie_word_embeddings": tied})
        job = _job(method, precision=precision, loss=loss)
        units = fsdp_units(spec, job, "fsdp2", reshard, wrap=wrap)
        kw = dict(param_b=Fraction(2) if precision.endswith("-mixed") else None, reduce_b=Fraction(2), hsdp=hsdp,
                  offload=offload, backend="cpu", root_output_b=Fraction(2), torch_version=2.13)
        none = ActivationSchedule(Fraction(0), (Fraction(0),) * spec.num_layers, Fraction(0), Fraction(0),
                                  Fraction(0), Fraction(0))
        assert fsdp2_moment_peak(units, 2, none, **kw).total == fsdp2_transient_bytes(units, 2, **kw)


def test_breakdown_is_the_moment_of_the_peak():
    """The components sum to the peak and describe its moment; FSDP1 keeps the old composition."""
    spec = model_from_config(_LLAMA)
    for job, layout in ((_job("full"), Layout(2, 1, "fsdp")),
                        (_job("full", gradient_checkpointing=True), Layout(2, 1, "fsdp")),
                        (_job("lora", precision="bf16", loss="torchtune"), Layout(2, 1, "fsdp", fsdp_wrap="torchtune")),
                        (_job("full", precision="bf16", loss="torchtune"),
                         Layout(2, 1, "fsdp", fsdp_wrap="torchtune", offload_params=True, offload_optimizer=True))):
        mem = estimate_memory(spec, job, layout, backend="cpu")
        c = mem.components
        assert sum(v for k, v in c.items() if k not in ("cuda_context", "nccl_buffers", "allocator_reserve")) \
            == mem.peak_allocated_bytes
        note = next(n for n in mem.notes if n.startswith("fsdp2: the forward/backward peak is at "))
        assert ("forward" in note or "backward" in note) and mem.peak_phase == "forward_backward"
        lm = layout_memory(spec, job, layout, model_states(spec, job), memory_constants(), "cpu")
        # the gradient shards made by the moment; model states still count all of them
        assert c["gradients"] <= lm.gradients and mem.model_states_bytes >= c["frozen_weights"] + lm.gradients
    fsdp1 = estimate_memory(spec, _job("full"), Layout(2, 1, "fsdp", fsdp_version=1), backend="cpu")
    assert not any("peak is at" in n for n in fsdp1.notes)


def test_moments_do_not_exceed_the_separate_peaks_summed():
    """Walking the moments can only lower the FSDP2 peak of the 70B LoRA row's recipe against the
    old sum (resident + every saved activation + the largest activation transient + the engine's
    transient peak), here rebuilt from the same parts."""
    from ftplan.catalog.models import resolve_model
    from ftplan.memory import activation_parts

    spec = resolve_model("llama-3.1-70b")
    job = Job(method="lora", precision="bf16", loss="torchtune", seq_len=2048, micro_batch=2,
              gradient_checkpointing=True, lora=LoraSpec(r=16, alpha=32, target_modules=("q_proj", "k_proj", "v_proj")))
    layout = Layout(8, 1, "fsdp", fsdp_wrap="torchtune")
    consts = dataclasses.replace(memory_constants(), cublas_workspace_bytes=0)
    mem = estimate_memory(spec, job, layout, consts=consts)
    lm = layout_memory(spec, job, layout, model_states(spec, job), consts)
    act = activation_parts(spec, job, layout, consts=consts)
    resident = lm.frozen_weights + lm.trainable_weights + lm.gradients + lm.optimizer_states
    summed = resident + act.device_saved_bytes + act.loss_saved_bytes + act.transient_bytes + max(
        lm.transient, lm.forward_transient or 0)
    assert mem.peak_allocated_bytes < summed
