"""Claims of the seed articles (shared/seeds), answered with ftplan's numbers."""

from __future__ import annotations

import pytest

from ftplan.catalog.gpus import load_gpus
from ftplan.catalog.models import resolve_model
from ftplan.job import Job, Layout
from ftplan.memory import estimate_memory, model_states
from ftplan.planner import fit

GB = 10**9


@pytest.fixture(scope="module")
def llama70():
    return resolve_model("llama-3.1-70b")


def test_70b_qlora_fits_one_80gb_gpu_with_checkpointing(llama70):
    """003: 'QLoRA + gradient checkpointing fine-tunes Llama 3 70B on a single 80GB GPU' -> yes."""
    h100 = load_gpus()["h100-sxm"]
    for seq in (2048, 4096):
        job = Job(method="qlora", seq_len=seq, gradient_checkpointing=True)
        mem = estimate_memory(llama70, job, Layout())
        assert mem.device_total_bytes <= 80 * GB * 0.95, (seq, mem.device_total_bytes / GB)
    r = fit(llama70, Job(method="qlora", seq_len=2048, gradient_checkpointing=True), h100)
    assert r.fits and r.max_seq_len >= 4096
    # without checkpointing at 4096 it does not
    assert estimate_memory(llama70, Job(method="qlora", seq_len=4096, gradient_checkpointing=False),
                           Layout()).device_total_bytes > 80 * GB


def test_70b_qlora_on_rtx4090_in_19_5_gb_is_false(llama70):
    """004: '70B Llama 2, 4-bit, rank 8, checkpointing, flash, batch 2: 19.5GB of 24GB' -> no."""
    job = Job(method="qlora", seq_len=512, micro_batch=2, gradient_checkpointing=True, attn_impl="flash")
    job = job.with_(lora=job.lora.__class__(r=8))
    st = model_states(llama70, job)
    assert st.frozen_weights > 35 * GB  # 4-bit weights alone are ~2x the claimed total
    mem = estimate_memory(llama70, job, Layout())
    assert mem.device_total_bytes > 24 * GB
    r = fit(llama70, job, load_gpus()["rtx-4090"])
    assert not r.fits and r.max_seq_len is None and r.max_micro_batch is None


def test_one_192gb_b200_does_not_hold_70b_full_states(llama70):
    """002: 'a single 192GB B200 holds weights, gradients and optimizer states of a 70B model' -> no."""
    st = model_states(llama70, Job(method="full"))  # bf16-mixed AdamW: fp32 weights, grads, 2 states
    states = st.trainable_weights + st.master_weights + st.gradients + st.optimizer_states
    assert states > 5 * 192 * GB  # ~1.1 TB
    b200 = load_gpus()["b200"]
    assert estimate_memory(llama70, Job(method="full", gradient_checkpointing=True), Layout()).device_total_bytes \
        > b200.memory_bytes


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "zero3", "fsdp"])
def test_70b_full_needs_more_than_one_8gpu_node_without_offload(llama70, strategy):
    """001/003: '70B full fine-tuning needs a multi-node cluster' -> yes for data-parallel sharding
    with transformers' own loss (full fp32 logits): no single 8-GPU node of <=192 GB GPUs fits it
    without offload (micro-batch 1, checkpointing, seq 2048, the planner's 5% safety margin).
    ZeRO-3 on 8 GPUs is close to 192 GB per GPU; TRL's fused LM head (no logits at all) saves a
    little, and still no 80-141 GB GPU holds it. FSDP2 keeps no bf16 copy of its fp32 shards
    (16 B/param of states, ~165 GB per GPU): an 8 x B200 (192 GB) node holds it, no node of
    <= 141 GB GPUs (H200) does."""
    job = Job(method="full", seq_len=2048, gradient_checkpointing=True, loss="hf")
    mem = estimate_memory(llama70, job, Layout(8, 1, strategy))
    trl = estimate_memory(llama70, job.with_(loss="trl"), Layout(8, 1, strategy))
    assert trl.device_total_bytes <= mem.device_total_bytes  # (ZeRO's peak is the optimizer step)
    assert not trl.fits(141 * GB, margin=0.05)
    cap = 141 * GB if strategy == "fsdp" else 192 * GB
    assert not mem.fits(cap, margin=0.05)
    for g in load_gpus().values():
        if g.memory_bytes <= cap:
            assert not mem.fits(g.memory_bytes, margin=0.05), g.name
    if strategy in ("zero3", "fsdp"):
        # the articles' "two 8x H100 servers" are not enough either with bf16-mixed AdamW
        # (fp32 weights + bf16 copy + fp32 grads + 2 fp32 states = 18 B/param: ~79 GB/GPU of
        # states over 16 GPUs); four are
        assert not estimate_memory(llama70, job, Layout(8, 2, strategy)).fits(80 * GB, margin=0.05)
        assert estimate_memory(llama70, job, Layout(8, 4, strategy)).fits(80 * GB, margin=0.05)


# ---------------------------------------------------------------------------------------------
# FP8 / NVFP4 claims (memory; throughput claims need the runtime model's FP8/FP4 peaks)
# ---------------------------------------------------------------------------------------------
def _lp(job: Job, precision: str) -> Job:
    from ftplan.lowprec import apply_precision

    return apply_precision(job, precision)


def test_fp4_is_not_4x_smaller_than_fp16(llama70):
    """002: 'FP4 ... reducing the memory footprint by 4x compared to FP16' -> 3.6x for the linear
    weights (E2M1 values + one E4M3 scale per 16 + an fp32 per-tensor scale = 4.5 bits), 3.3x for
    the whole frozen 70B base (embeddings and lm_head stay bf16 in torchao's NVFP4 weight-only base)."""
    lora = model_states(llama70, Job(method="lora")).frozen_weights
    nvfp4 = model_states(llama70, _lp(Job(method="lora"), "nvfp4-weight-only")).frozen_weights
    assert 3.2 < lora / nvfp4 < 3.4
    from ftplan.lowprec import get_recipe

    nvfp4_fmt = get_recipe("nvfp4-weight-only").weight
    q_proj = nvfp4_fmt.tensor_bytes(8192, 8192, swizzled=True)  # one 70B q_proj
    assert 2 * 8192 * 8192 / q_proj == pytest.approx(2 / 0.5625, rel=1e-6)  # 3.56x, not 4x


def test_nvfp4_headroom_for_70b_on_one_b200(llama70):
    """000: 'NVFP4 frees headroom for optimizer states and gradients ... larger batches and longer
    context for LoRA'. LoRA: yes - an NVFP4 base (torchao weight-only + PEFT, bf16 GEMMs) takes the
    70B base from 131 to 40 GiB, and one B200 goes from 12.2k to 56k tokens of context (checkpointing,
    micro-batch 1, TRL's fused loss) or from micro-batch 2 to 13 at 4k (the last layer's recompute,
    with PEFT's fp32 cast of the MLP product, sets the peak). Full fine-tuning: no - NVFP4 GEMMs (TE) keep
    fp32 master weights, gradients and AdamW states (16 bytes/parameter, ~1.05 TiB for 70B); only the
    weight working copy shrinks (2 -> 1.125 bytes/parameter)."""
    b200 = load_gpus()["b200"]
    job = Job(method="lora", seq_len=4096, gradient_checkpointing=True)
    base, nv = fit(llama70, job, b200), fit(llama70, _lp(job, "nvfp4"), b200)
    assert base.max_seq_len < 15_000 < 50_000 < nv.max_seq_len
    assert base.max_micro_batch == 2 and nv.max_micro_batch >= 12
    full = _lp(Job(method="full", gradient_checkpointing=True), "nvfp4")
    assert full.low_precision == "nvfp4-te"
    st, st16 = model_states(llama70, full), model_states(llama70, Job(method="full"))
    assert st.trainable_weights + st.gradients + st.optimizer_states > 1.0 * 2**40
    assert st.master_weights == pytest.approx(st16.master_weights * 1.125 / 2, rel=0.01)
    assert not estimate_memory(llama70, full, Layout()).fits(b200.memory_bytes)


def test_fp8_reduces_memory_only_for_full_fine_tuning(llama70):
    """001/003: 'FP8 ... reduces VRAM consumption compared to FP16/BF16'. Full fine-tuning with
    torchao float8 (accelerate's fp8 default): FSDP2 keeps no bf16 weight copy (fp32 shards, bf16
    gathered on the fly), so only the gathered layers shrink with float8 all-gather: 70B over 8 GPUs
    ~1.7 GiB less per GPU (of ~165). LoRA with FP8 GEMMs: no - torchao's float8
    function saves the inputs of the frozen base linears, +13.7 GiB at 2k tokens without
    checkpointing; with checkpointing only the recomputed layer's (+0.18 GiB)."""
    full = Job(method="full", seq_len=2048, gradient_checkpointing=True)
    m16 = estimate_memory(llama70, full, Layout(8, 1, "fsdp")).device_total_bytes
    m8 = estimate_memory(llama70, _lp(full, "fp8"), Layout(8, 1, "fsdp")).device_total_bytes
    assert 1 * 2**30 < m16 - m8 < 3 * 2**30
    lora = Job(method="lora", seq_len=2048, gradient_checkpointing=False)
    more = (estimate_memory(llama70, _lp(lora, "fp8")).device_total_bytes
            - estimate_memory(llama70, lora).device_total_bytes)
    assert 12 * 2**30 < more < 16 * 2**30
    # with checkpointing only the recomputed layer keeps them: +0.18 GiB
    ck = lora.with_(gradient_checkpointing=True)
    more = estimate_memory(llama70, _lp(ck, "fp8")).device_total_bytes - estimate_memory(llama70, ck).device_total_bytes
    assert 0 <= more < 0.25 * 2**30


def test_a100_cannot_use_fp8(llama70):
    """001: 'the A100 lacks ... native FP8 support' -> yes: ftplan refuses FP8 recipes on every
    Ampere GPU (accelerate itself would silently fall back to fp16 with a warning)."""
    from ftplan.errors import ConfigError

    for name in ("a100-80gb-sxm", "a100-40gb-pcie"):
        with pytest.raises(ConfigError, match="no FP8 tensor cores"):
            fit(llama70, _lp(Job(method="lora", gradient_checkpointing=True), "fp8"), load_gpus()[name])


def test_l40s_supports_fp8(llama70):
    """003: 'choose the L40S to leverage FP8' -> the L40S (sm89) runs every FP8 recipe but no FP4
    (733 dense FP8 TFLOPS = 2x its bf16)."""
    from ftplan.lowprec import get_recipe, gpu_problem

    l40s = load_gpus()["l40s"]
    assert gpu_problem(get_recipe("fp8-tensorwise"), l40s) is None
    assert gpu_problem(get_recipe("fp8-te-delayed"), l40s) is None
    assert gpu_problem(get_recipe("nvfp4-te"), l40s) is not None
    assert l40s.fp8_tflops == pytest.approx(2 * l40s.bf16_tflops, rel=0.02)


def _tps(model, job, layout, gpu):
    from ftplan.runtime import estimate_runtime

    return estimate_runtime(model, job, layout, load_gpus()[gpu]).tokens_per_s / layout.world_size


# The throughput claims below are answered for one stated setup: 8 GPUs, FSDP, seq 8192,
# checkpointing, torchao tensorwise FP8 (accelerate's `mixed_precision: fp8`) and TE NVFP4. The FP8
# GEMM efficiency relative to bf16 is calibrated on torchtitan's 8B / 8 H100 run (1.248x; the fit
# stops at 1.0, 1.206x) and NVFP4's on NVIDIA's NVFP4 blog (1.59x): see test_lowprec_runtime.py for
# the published points these numbers are held against.
@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b"])
def test_fp8_does_not_double_throughput(name):
    """001/003: 'FP8 can double your training throughput' -> no. ftplan: full fine-tuning 1.23x (8B)
    / 1.41x (70B) on H100, the same on B200 (1.22x / 1.41x). Held against: torchtitan's 8B / 8 H100
    Float8 1.25-1.28x (commit 7a04053; Dec 2024 benchmark) and torchao's 'up to 1.5x' at 70B, each
    within 10 %. Why not 2x: FP8 GEMMs run at twice the peak only for the converted linears (the
    first q_proj and lm_head stay bf16), attention (~25-35 % of the step at 8k tokens), norms and
    the loss stay bf16, the quantize kernels add memory traffic (~10 % of the 8B step), and
    communication / optimizer do not shrink; 70B gains more (larger GEMMs, smaller attention share).
    LoRA: 1.05x (8B) / 1.12x (70B): torchao's float8 function also runs the frozen base's
    weight-gradient GEMM (3 FP8 GEMMs where bf16 LoRA runs 2). Closest to 2x: NVFP4 GEMMs (TE, full
    fine-tuning) on B200, 1.37x (8B) / 1.66x (70B) over bf16 (NVIDIA's blog: 1.59x for 8B
    pre-training with micro-batch 2 -> 4)."""
    model = resolve_model(name)
    lay = Layout(8, 1, "fsdp")
    big = name.endswith("70b")
    full = Job(method="full", seq_len=8192, gradient_checkpointing=True)
    lora = Job(method="lora", seq_len=8192, gradient_checkpointing=True)
    for gpu in ("h100-sxm", "b200"):
        s = _tps(model, _lp(full, "fp8"), lay, gpu) / _tps(model, full, lay, gpu)
        assert s == pytest.approx(1.41 if big else 1.225, abs=0.02), (gpu, s)
        if not big:  # torchtitan 8B / 8 H100: 1.248x (commit 7a04053), 1.28x (Dec 2024 benchmark)
            assert s == pytest.approx(1.26, rel=0.10)
        else:  # torchao: 'up to 1.5x' at 70B
            assert 1.5 * 0.9 < s <= 1.5
        s = _tps(model, _lp(lora, "fp8"), lay, gpu) / _tps(model, lora, lay, gpu)
        assert s == pytest.approx(1.12 if big else 1.045, abs=0.02), (gpu, s)
    s4 = _tps(model, _lp(full, "nvfp4"), lay, "b200") / _tps(model, full, lay, "b200")
    assert s4 == pytest.approx(1.66 if big else 1.37, abs=0.02)
    assert s4 < 2.0


def test_b200_vs_h100_is_the_peak_not_fp4():
    """002/003: 'B200 delivers up to 2.2x the training speed of the H100 by utilizing native
    FP4/FP8' -> the ~2x holds at EVERY precision: 70B full fine-tuning on 8 GPUs 2.12x per GPU in
    bf16, 2.11x in FP8 (B200's dense peak is 2.27x H100's in bf16 and in FP8 alike; HBM 2.3x), and
    2.12x for 70B LoRA in FP8, against MLPerf Training v4.1's 2.2x (Llama 2 70B LoRA, FP8 on both,
    NVIDIA's submissions) within 10 %. FP4 adds on top only where NVFP4 GEMMs run (TE, full
    fine-tuning): B200 NVFP4 vs H100 FP8 2.50x, far below the 4.5x of the peaks (9 PFLOPS NVFP4 vs
    1.98 FP8): only the converted GEMMs speed up, at 0.85 of their peak's share (NVIDIA's 1.59x)."""
    model = resolve_model("llama-3.1-70b")
    lay = Layout(8, 1, "fsdp")
    full = Job(method="full", seq_len=8192, gradient_checkpointing=True)
    lora = Job(method="lora", seq_len=8192, gradient_checkpointing=True)
    bf = _tps(model, full, lay, "b200") / _tps(model, full, lay, "h100-sxm")
    f8 = _tps(model, _lp(full, "fp8"), lay, "b200") / _tps(model, _lp(full, "fp8"), lay, "h100-sxm")
    assert bf == pytest.approx(2.12, abs=0.02) and f8 == pytest.approx(2.11, abs=0.02)
    assert abs(f8 / bf - 1) < 0.02
    lf8 = _tps(model, _lp(lora, "fp8"), lay, "b200") / _tps(model, _lp(lora, "fp8"), lay, "h100-sxm")
    assert lf8 == pytest.approx(2.2, rel=0.10)  # MLPerf v4.1
    mixed = _tps(model, _lp(full, "nvfp4"), lay, "b200") / _tps(model, _lp(full, "fp8"), lay, "h100-sxm")
    assert mixed == pytest.approx(2.50, abs=0.03)


def test_claims_report_covers_every_fp8_fp4_claim():
    """`ftplan claims`: one entry per FP8/FP4 claim of the seeds, verdict and numbers; the numbers
    are the ones the tests above derive (same runtime path, same jobs)."""
    from ftplan import api

    doc = api.claims().to_dict()
    assert doc["schema"] == "ftplan.claims/1"
    by_id = {c["id"]: c for c in doc["claims"]}
    assert set(by_id) == {"fp8-doubles-throughput", "b200-2x-h100", "nvfp4-headroom-70b-b200", "fp4-4x-smaller",
                          "fp8-reduces-memory", "a100-no-fp8", "l40s-fp8"}
    m70 = resolve_model("llama-3.1-70b")
    lay = Layout(8, 1, "fsdp")
    full = Job(method="full", seq_len=8192, gradient_checkpointing=True)
    n = by_id["fp8-doubles-throughput"]["numbers"]
    assert by_id["fp8-doubles-throughput"]["verdict"] == "false"
    assert n["full_70b_h100"] == pytest.approx(_tps(m70, _lp(full, "fp8"), lay, "h100-sxm")
                                               / _tps(m70, full, lay, "h100-sxm"), rel=1e-9)
    assert max(v for v in n.values()) < 2.0
    r = by_id["b200-2x-h100"]["numbers"]
    assert r["fp8"] == pytest.approx(2.11, abs=0.02) and r["nvfp4_vs_h100_fp8"] == pytest.approx(2.50, abs=0.03)
    assert by_id["nvfp4-headroom-70b-b200"]["numbers"]["full_fits_one_b200"] == 0.0
