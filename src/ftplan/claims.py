"""The seed articles' FP8 / FP4 claims, answered with ftplan's numbers (``ftplan claims``).

Each claim is recomputed from the memory and runtime models (the same functions ``estimate`` and
``compare`` use), for fixed, stated jobs: Llama 3.1 8B and 70B, 8 GPUs with FSDP, sequence 8192,
gradient checkpointing, torchao tensorwise FP8 (what ``accelerate``'s ``mixed_precision: fp8``
picks) and Transformer Engine NVFP4. ``tests/test_seed_claims.py`` holds the same numbers with the
reasons. Pure; no I/O beyond the bundled catalogs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Claim", "seed_claims", "CLAIMS_SCHEMA"]

CLAIMS_SCHEMA = "ftplan.claims/1"


@dataclass(frozen=True)
class Claim:
    id: str
    source: str  # which seed article
    claim: str
    verdict: str  # "true", "false", "partly"
    answer: str  # the numbers, in words
    numbers: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "source": self.source, "claim": self.claim, "verdict": self.verdict,
                "answer": self.answer, "numbers": dict(self.numbers)}


def _tps_per_gpu(model, job, layout, gpu) -> float:
    from .runtime import estimate_runtime

    return estimate_runtime(model, job, layout, gpu).tokens_per_s / layout.world_size


def seed_claims() -> list[Claim]:
    """Every FP8 / FP4 claim of the seed articles, with ftplan's answer."""
    from .catalog.gpus import load_gpus
    from .catalog.models import resolve_model
    from .job import Job, Layout
    from .memory import estimate_memory, model_states
    from .planner import fit

    gpus = load_gpus()
    h100, b200, a100, l40s = gpus["h100-sxm"], gpus["b200"], gpus["a100-80gb-sxm"], gpus["l40s"]
    m8, m70 = resolve_model("llama-3.1-8b"), resolve_model("llama-3.1-70b")
    lay = Layout(8, 1, "fsdp")
    full = Job(method="full", seq_len=8192, gradient_checkpointing=True)
    lora = Job(method="lora", seq_len=8192, gradient_checkpointing=True)
    out: list[Claim] = []

    # FP8 doubles throughput
    n: dict[str, float] = {}
    for mname, model in (("8b", m8), ("70b", m70)):
        for gname, g in (("h100", h100), ("b200", b200)):
            n[f"full_{mname}_{gname}"] = _tps_per_gpu(model, full.with_(precision="fp8"), lay, g) / \
                _tps_per_gpu(model, full, lay, g)
            n[f"lora_{mname}_{gname}"] = _tps_per_gpu(model, lora.with_(precision="fp8"), lay, g) / \
                _tps_per_gpu(model, lora, lay, g)
    n["full_70b_b200_nvfp4"] = _tps_per_gpu(m70, full.with_(precision="nvfp4"), lay, b200) / \
        _tps_per_gpu(m70, full, lay, b200)
    out.append(Claim(
        "fp8-doubles-throughput", "001, 003", "FP8 can double your training throughput compared to FP16/BF16",
        "false",
        f"FP8 (torchao tensorwise) vs bf16, tokens/s per GPU: full fine-tuning {n['full_8b_h100']:.2f}x (8B) / "
        f"{n['full_70b_h100']:.2f}x (70B) on H100, {n['full_8b_b200']:.2f}x / {n['full_70b_b200']:.2f}x on B200 "
        f"(published: torchtitan 8B 1.25-1.28x, torchao 'up to 1.5x' at 70B); LoRA {n['lora_8b_h100']:.2f}x / "
        f"{n['lora_70b_h100']:.2f}x (torchao also runs the frozen base's weight-gradient GEMM). Only the converted "
        f"linears' GEMMs run at the FP8 peak; attention, norms, the loss, the quantize kernels' memory traffic, "
        f"communication and the optimizer do not speed up. NVFP4 GEMMs on B200 (TE, full): "
        f"{n['full_70b_b200_nvfp4']:.2f}x (NVIDIA's blog: 1.59x for 8B pre-training).", n))

    # B200 2.2x H100 through FP4/FP8
    r = {
        "bf16": _tps_per_gpu(m70, full, lay, b200) / _tps_per_gpu(m70, full, lay, h100),
        "fp8": _tps_per_gpu(m70, full.with_(precision="fp8"), lay, b200)
        / _tps_per_gpu(m70, full.with_(precision="fp8"), lay, h100),
        "nvfp4_vs_h100_fp8": _tps_per_gpu(m70, full.with_(precision="nvfp4"), lay, b200)
        / _tps_per_gpu(m70, full.with_(precision="fp8"), lay, h100),
        "lora_fp8": _tps_per_gpu(m70, lora.with_(precision="fp8"), lay, b200)
        / _tps_per_gpu(m70, lora.with_(precision="fp8"), lay, h100),
    }
    out.append(Claim(
        "b200-2x-h100", "001, 002, 003", "B200 delivers 2.2x the training speed of the H100 through native FP4/FP8",
        "partly",
        f"~2x per GPU, but at every precision: 70B full fine-tuning {r['bf16']:.2f}x in bf16 and {r['fp8']:.2f}x in "
        f"FP8, 70B LoRA {r['lora_fp8']:.2f}x in FP8 (B200's dense peak is 2.27x H100's in bf16 and FP8 alike; "
        f"MLPerf v4.1's 2.2x on Llama 2 70B LoRA is FP8 on both); FP4 adds only where NVFP4 GEMMs run (TE, full "
        f"fine-tuning): B200 NVFP4 vs H100 FP8 {r['nvfp4_vs_h100_fp8']:.2f}x, not the 4.5x of the peaks.", r))

    # NVFP4 headroom for 70B on one B200
    j4 = Job(method="lora", seq_len=4096, gradient_checkpointing=True)
    base, nv = fit(m70, j4, b200), fit(m70, j4.with_(precision="nvfp4"), b200)
    st16, st4 = model_states(m70, Job(method="lora")), model_states(m70, Job(method="lora", precision="nvfp4"))
    full4 = Job(method="full", gradient_checkpointing=True, precision="nvfp4")
    s4 = model_states(m70, full4)
    h = {"lora_base_gib_bf16": st16.frozen_weights / 2**30, "lora_base_gib_nvfp4": st4.frozen_weights / 2**30,
         "max_seq_bf16": float(base.max_seq_len or 0), "max_seq_nvfp4": float(nv.max_seq_len or 0),
         "max_micro_batch_bf16": float(base.max_micro_batch or 0),
         "max_micro_batch_nvfp4": float(nv.max_micro_batch or 0),
         "full_states_tib": (s4.trainable_weights + s4.gradients + s4.optimizer_states) / 2**40,
         "full_fits_one_b200": float(estimate_memory(m70, full4, Layout()).fits(b200.memory_bytes))}
    out.append(Claim(
        "nvfp4-headroom-70b-b200", "000", "NVFP4 frees headroom for optimizer states and gradients; larger batches "
        "and longer context for LoRA/PEFT in a fixed memory budget", "partly",
        f"LoRA: yes - an NVFP4 base (torchao weight-only + PEFT; GEMMs stay bf16) shrinks 70B's frozen weights from "
        f"{h['lora_base_gib_bf16']:.0f} to {h['lora_base_gib_nvfp4']:.0f} GiB; one B200 goes from "
        f"{h['max_seq_bf16']:,.0f} to {h['max_seq_nvfp4']:,.0f} tokens of context (micro-batch 1) and from "
        f"micro-batch {h['max_micro_batch_bf16']:.0f} to {h['max_micro_batch_nvfp4']:.0f} at 4k. Full fine-tuning: no - "
        f"NVFP4 GEMMs keep fp32 master weights, gradients and AdamW states ({h['full_states_tib']:.2f} TiB for 70B); "
        f"only the weight working copy shrinks (2 -> 1.125 bytes/parameter).", h))

    # FP4 4x smaller than FP16
    ratio = st16.frozen_weights / st4.frozen_weights
    out.append(Claim(
        "fp4-4x-smaller", "002", "FP4 reduces the memory footprint by 4x compared to FP16", "false",
        f"NVFP4 stores 4.5 bits per weight (E2M1 + one E4M3 scale per 16 + an fp32 per-tensor scale): the linear "
        f"weights shrink 3.56x, the whole frozen 70B base {ratio:.2f}x (embeddings and lm_head stay bf16).",
        {"linear_ratio": 2 / 0.5625, "model_ratio": ratio}))

    # FP8 reduces memory
    mf = estimate_memory(m70, Job(method="full", seq_len=2048, gradient_checkpointing=True), lay).device_total_bytes
    mf8 = estimate_memory(m70, Job(method="full", seq_len=2048, gradient_checkpointing=True, precision="fp8"),
                          lay).device_total_bytes
    ml = estimate_memory(m70, Job(method="lora", seq_len=2048, gradient_checkpointing=False)).device_total_bytes
    ml8 = estimate_memory(m70, Job(method="lora", seq_len=2048, gradient_checkpointing=False,
                                   precision="fp8")).device_total_bytes
    mm = {"full_70b_fsdp8_gib_saved": (mf - mf8) / 2**30, "lora_70b_gib_added": (ml8 - ml) / 2**30}
    out.append(Claim(
        "fp8-reduces-memory", "001, 003", "FP8 reduces VRAM consumption compared to FP16/BF16", "partly",
        f"Full fine-tuning: a little. FSDP2 keeps fp32 shards and gathers bf16 layers on the fly (no persistent "
        f"bf16 copy to drop): with float8 all-gather only the gathered layers shrink, 70B over 8 GPUs "
        f"{mm['full_70b_fsdp8_gib_saved']:.1f} GiB less per GPU (weights, gradients and AdamW states stay fp32); "
        f"HF Trainer's autocast without checkpointing keeps bf16 weight copies (2 B/param) that torchao drops. "
        f"LoRA: no, +{mm['lora_70b_gib_added']:.1f} GiB at 2k tokens without checkpointing (the float8 function "
        f"saves the frozen linears' inputs); with checkpointing only the recomputed layer's.", mm))

    # A100 / L40S
    from .lowprec import get_recipe, gpu_problem

    out.append(Claim(
        "a100-no-fp8", "001", "The A100 lacks native FP8 support", "true",
        f"ftplan refuses FP8/FP4 recipes on Ampere: {gpu_problem(get_recipe('fp8-tensorwise'), a100)}",
        {"a100_fp8_tflops": 0.0}))
    from .runtime import estimate_runtime

    m8_full, m8_lora = Job(method="full", seq_len=4096), Job(method="lora", seq_len=4096)
    l8 = {
        "full_8b_fsdp8": estimate_runtime(m8, m8_full.with_(precision="fp8"), lay, l40s).tokens_per_s
        / estimate_runtime(m8, m8_full, lay, l40s).tokens_per_s,
        "lora_8b_one_gpu": estimate_runtime(m8, m8_lora.with_(precision="fp8"), Layout(), l40s).tokens_per_s
        / estimate_runtime(m8, m8_lora, Layout(), l40s).tokens_per_s,
    }
    out.append(Claim(
        "l40s-fp8", "003", "Choose the L40S to leverage FP8 precision", "partly",
        f"The L40S (sm89) runs every FP8 recipe ({l40s.fp8_tflops:g} dense FP8 TFLOPS = 2x its bf16) but no FP4. "
        f"FP8 (torchao tensorwise) on L40S, 8B at 4k tokens: full fine-tuning over 8 GPUs {l8['full_8b_fsdp8']:.2f}x, "
        f"LoRA on one GPU {l8['lora_8b_one_gpu']:.2f}x (its 864 GB/s make the quantize kernels and the discarded "
        f"weight-gradient GEMMs cost what the FP8 GEMMs save); its 48 GB decide more than FP8.",
        {"l40s_fp8_tflops": float(l40s.fp8_tflops or 0), "l40s_bf16_tflops": float(l40s.bf16_tflops), **l8}))
    return out
