"""FP8 / FP4 step time: the runtime model's low-precision terms (runtime.py: converted linears'
GEMMs at the FP8/FP4 peak, quantize traffic, float8 all-gather, weight-only dequant) held against
published speedups (catalog/data/lowprec_reference.json) and published FP8 throughput
(runtime_reference.json, torchtitan's Float8 rows).

Calibration: ``efficiency_vs_bf16`` of fp8-tensorwise / fp8-rowwise was fitted (scripts/calibrate.py
lowprec) on ONE run, torchtitan's Llama 3 8B on 8 H100s (tensorwise 1.248x, rowwise 1.115x), and
nvfp4-te's on NVIDIA's NVFP4 blog (1.59x): those points only check that the fit is what the data
file holds. Every other point is independent: torchao's published bounds (8B / 8 GPUs 1.25x, 70B /
128 GPUs 1.5x), its two single-linear microbenchmarks, the Crusoe 2K-H200 rowwise run, MLPerf's
B200-vs-H100 ratio, and torchtitan's Dec 2024 Float8 throughput (a different publication than the
calibration commit).
"""

from __future__ import annotations

import pytest

from ftplan.catalog.gpus import load_gpus
from ftplan.catalog.lowprec_reference import load_points, predicted_speedup, published_speedup
from ftplan.catalog.models import resolve_model
from ftplan.errors import ConfigError
from ftplan.job import Job, Layout
from ftplan.runtime import estimate_runtime

GPUS = load_gpus()
POINTS = {p.id: p for p in load_points()}


@pytest.mark.parametrize("pid", sorted(i for i, p in POINTS.items() if p.calibrates))
def test_calibration_points(pid):
    """The fitted efficiencies reproduce their points: rowwise 1.115x and NVFP4 1.59x exactly;
    tensorwise 1.206x for the published 1.248x (-3.3 %): the fit stops at its bound, FP8 GEMMs
    reaching the same fraction of their 2x peak as bf16 GEMMs of theirs (efficiency 1.0)."""
    p = POINTS[pid]
    assert predicted_speedup(p) == pytest.approx(published_speedup(p), rel=0.05)


@pytest.mark.parametrize("pid", sorted(i for i, p in POINTS.items() if not p.calibrates))
def test_independent_points(pid):
    """Each published point not used by the fit, within its stated tolerance (and below an 'up to'
    bound). ftplan today: torchao 8B/8 GPUs 1.235x (<= 1.25x), 70B/128 GPUs 1.445x (<= 1.5x),
    linear 1024x2048x1024 0.79x (0.80x), 4096x8192x16384 1.47x (1.39x, +6 %: the compiled
    benchmark's casts are cheaper than the eager passes charged), Crusoe 70B rowwise on H200 1.40x
    (1.34-1.43x), MLPerf v4.1 B200 / H100 70B LoRA in FP8 2.12x (2.2x, -4 %)."""
    p = POINTS[pid]
    pred, pub = predicted_speedup(p), published_speedup(p)
    if p.bound == "upper":
        assert pred <= pub * 1.005, (pred, pub)
    assert pred == pytest.approx(pub, rel=p.tolerance), (pred, pub)


def test_torchtitan_float8_throughput_held_out():
    """torchtitan's Dec 2024 H100 benchmark (held out: never used by any fit), tokens/s per GPU:
    8B FSDP + compile + Float8 on 8 GPUs 8,532 (ftplan 8,666, +1.6 %) and 128 GPUs 8,380 (+2.9 %),
    8B at 32k tokens 3,890 (-13.8 %), 70B FSDP 32 x TP 8 829 (-2.2 %); the Float8 / bf16 ratio of
    the same setup 1.28x measured, 1.21x predicted (-5 %): within the 15 % ratio target."""
    from ftplan.catalog.runtime_reference import evaluate, load_reference, ratio_checks

    refs = [r for r in load_reference() if r.id.startswith("torchtitan-") and "h100" in r.id]
    outs = evaluate(refs)
    fp8 = [o for o in outs if o.ref.job.get("precision") == "fp8-tensorwise"]
    assert len(fp8) == 4
    for o in fp8:
        assert abs(o.error) < 0.15, (o.ref.id, o.error)
    prec = [r for r in ratio_checks(outs) if r["kind"] == "precision"]
    assert len(prec) == 2 and all(abs(r["error"]) < 0.15 for r in prec), prec


# ---------------------------------------------------------------------------------------------
# the terms
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama8():
    return resolve_model("llama-3.1-8b")


def _rt(model, job, lay=Layout(8, 1, "fsdp"), gpu="h100-sxm"):
    return estimate_runtime(model, job, lay, GPUS[gpu])


def test_only_the_converted_gemms_and_casts_change(llama8):
    """FP8 speeds up the converted linears' GEMMs only: attention, host time and the step
    overhead are the bf16 job's (the optimizer moves a little less: torchao keeps no bf16 weight
    copy, memory.model_states); the quantize kernels are their own term; the first
    q_proj and lm_head stay bf16 (accelerate skips the first and last linear), so part of the
    GEMM time is not low precision."""
    base = Job(method="full", seq_len=4096, gradient_checkpointing=True)
    b, f = _rt(llama8, base), _rt(llama8, base.with_(precision="fp8"))
    for k in ("attention_s", "host_per_micro_batch_s", "step_overhead_s"):
        assert f.breakdown[k] == pytest.approx(b.breakdown[k]), k
    assert 0.8 * b.breakdown["optimizer_s"] < f.breakdown["optimizer_s"] <= b.breakdown["optimizer_s"]
    assert b.breakdown["quantize_s"] == 0 and b.breakdown["low_precision_matmul_s"] == 0
    assert f.breakdown["quantize_s"] > 0
    assert 0 < f.breakdown["low_precision_matmul_s"] < f.breakdown["matmul_s"] < b.breakdown["matmul_s"]
    # weights cast by the recipe are not cast again by autocast
    assert f.breakdown["elementwise_s"] < b.breakdown["elementwise_s"]
    # FSDP2 float8 all-gather (tensorwise) moves less; rowwise gathers bf16
    assert f.breakdown["dp_comm_s"] < b.breakdown["dp_comm_s"]
    rw = _rt(llama8, base.with_(precision="fp8-rowwise"))
    assert rw.breakdown["dp_comm_s"] == pytest.approx(b.breakdown["dp_comm_s"])
    # MFU stays against the bf16 peak (torchtitan does not report one for float8 either)
    assert f.breakdown["peak_tflops"] == b.breakdown["peak_tflops"]
    assert f.breakdown["low_precision_tflops"] > f.breakdown["peak_tflops"]


def test_band_follows_the_step_time(llama8):
    """The uncertainty band is the same calibrated factor around the FP8 step time."""
    base = Job(method="full", seq_len=4096, gradient_checkpointing=True, dataset_tokens=10**8)
    b, f = _rt(llama8, base), _rt(llama8, base.with_(precision="fp8"))
    assert f.step_time_s_high / f.step_time_s == pytest.approx(b.step_time_s_high / b.step_time_s)
    assert f.hours_low < f.hours < f.hours_high and f.hours < b.hours
    assert f.tokens_per_s * f.step_time_s == pytest.approx(b.tokens_per_s * b.step_time_s)


def test_lora_runs_the_discarded_wgrad(llama8):
    """torchao's float8 function computes the frozen base's weight gradient: FP8 LoRA runs 3
    low-precision GEMMs per converted linear where bf16 LoRA runs 2 (fwd, dgrad) - plus the
    recompute under checkpointing: its FP8 GEMM time is exactly full fine-tuning's."""
    lora = Job(method="lora", seq_len=4096, gradient_checkpointing=False)
    b, f = _rt(llama8, lora), _rt(llama8, lora.with_(precision="fp8"))
    full_b = _rt(llama8, Job(method="full", seq_len=4096, gradient_checkpointing=False))
    full_f = _rt(llama8, Job(method="full", seq_len=4096, gradient_checkpointing=False, precision="fp8"))
    # the same low-precision GEMMs as full fine-tuning (fprop, dgrad, wgrad), bf16 LoRA has 2/3
    assert f.breakdown["low_precision_matmul_s"] == pytest.approx(full_f.breakdown["low_precision_matmul_s"], rel=1e-9)
    assert b.breakdown["matmul_s"] < full_b.breakdown["matmul_s"]


def test_weight_only_base_pays_dequant(llama8):
    """A torchao weight-only base (fp8-weight-only, nvfp4-weight-only) keeps bf16 GEMMs: same GEMM
    time, plus dequantization (NVFP4 also before the input gradient)."""
    lora = Job(method="lora", seq_len=4096, gradient_checkpointing=False)
    b = _rt(llama8, lora, Layout())
    f8 = _rt(llama8, lora.with_(precision="fp8-weight-only"), Layout())
    f4 = _rt(llama8, lora.with_(precision="nvfp4-weight-only"), Layout())
    assert f8.breakdown["matmul_s"] == pytest.approx(b.breakdown["matmul_s"])
    assert b.breakdown["dequant_s"] == 0 < f8.breakdown["dequant_s"] < f4.breakdown["dequant_s"]
    assert f8.breakdown["quantize_s"] == 0 and f4.step_time_s > b.step_time_s


def test_gpus_without_the_format_refuse(llama8):
    job = Job(method="full", seq_len=2048)
    with pytest.raises(ConfigError, match="no FP8 tensor cores"):
        _rt(llama8, job.with_(precision="fp8"), Layout(), "a100-80gb-sxm")
    with pytest.raises(ConfigError, match="no NVFP4 tensor cores"):
        _rt(llama8, job.with_(precision="nvfp4"), Layout(), "h100-sxm")
