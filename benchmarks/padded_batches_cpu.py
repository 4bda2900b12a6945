"""Padded micro-batches on CPU, by hand: ftplan's ``padded_batches`` terms against PyTorch, every family.

    python benchmarks/padded_batches_cpu.py [--only FAMILY[,FAMILY]] [--eager] [--recompute]

Each case builds a tiny real Hugging Face model (``ftplan.measure.configs.TINY_CONFIGS``), runs one
forward under HF Trainer's bf16 autocast on a padded micro-batch (``ftplan.measure.torchref.pad_batch``:
2 rows of 24 tokens, the last one shorter by 3, an ``attention_mask`` with zeros, labels -100 there)
and on the same batch unpadded, counts the bytes autograd saves (``measure_step``; autocast's weight
copies taken out, as ftplan counts them with the weights) and compares both with
``saved_activation_bytes`` (``padded_batches`` on / off): full and LoRA, checkpointing off and on,
sdpa (``--eager``: eager too, for the families with an eager path). ``--recompute`` also measures the
step's peak (``measure_loss_peak``: the last layer's recompute under checkpointing) padded and not,
and compares the difference with ftplan's (saved + recompute). Prints one line a case; exits 1 if a
case differs. ``tests/test_padded_batches.py`` keeps one case of each kind in CI.

Results (transformers 5.24, torch 2.13, 2026-11-25): every family of TINY_CONFIGS exact, sdpa, full
and LoRA, checkpointing off and on; eager unchanged by padding (llama, qwen3, mistral, gemma3_text,
phi3, gemma2, gpt_oss); the recompute peak's difference exact for llama, qwen2, gemma3_text.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from ftplan.job import Job, LoraSpec  # noqa: E402
from ftplan.measure.configs import TINY_CONFIGS  # noqa: E402
from ftplan.memory import activation_parts, saved_activation_bytes  # noqa: E402
from ftplan.model import model_from_config  # noqa: E402

#: the architecture has no sdpa path in transformers 5 (soft-capping, sinks): eager only
EAGER_ONLY = {"gemma2", "gpt_oss"}
EAGER = ("llama", "qwen3", "mistral", "gemma3_text", "phi3", "gemma2", "gpt_oss")


def measure(family: str, method: str, ckpt: bool, attn: str, padded: bool, batch: int = 2, seq: int = 24):
    import torch

    import ftplan.measure.torchref as TR

    cfg = TINY_CONFIGS[family]
    spec = model_from_config(cfg)
    dropout = 0.0 if spec.is_moe else 0.1  # PEFT refuses dropout on fused MoE experts
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TR.build_model(cfg, dtype="fp32" if method == "full" else "bf16", attn_implementation=attn)
        if method == "lora":
            from peft import LoraConfig, get_peft_model

            targets = (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
                       if family == "llama4_text" else "all-linear")
            model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout,
                                                     target_modules=targets, task_type="CAUSAL_LM"))
        orig = TR._model_dtype
        TR._model_dtype = lambda m: torch.float32  # HF Trainer bf16=True: autocast around the forward
        try:
            r = TR.measure_step(model, batch=batch, seq_len=seq, gradient_checkpointing=ckpt, dtype="bf16",
                                forward_only=True, padded=padded)
        finally:
            TR._model_dtype = orig
    job = Job(method=method, precision="bf16-mixed", micro_batch=batch, seq_len=seq, gradient_checkpointing=ckpt,
              attn_impl=attn, lora=LoraSpec(r=8, alpha=16, dropout=dropout), loss="hf", padded_batches=padded)
    measured = r.saved_activation_bytes - sum(x.nbytes for x in r.records if x.param_copy)
    return measured, saved_activation_bytes(spec, job, backend="cpu")


def recompute_cases(families: list[str]) -> int:
    from layer_recompute_cpu import config

    from ftplan.measure.loss_peak import measure_loss_peak

    bad = 0
    for fam in families:
        for mode in ("mixed-lora", "mixed-full"):
            cfg = config(fam, 256, 896)
            d = {}
            for padded in (False, True):
                m = measure_loss_peak(cfg, batch=2, seq_len=64, loss="hf", mode=mode, padded=padded)
                a = activation_parts(model_from_config(cfg), m.job().with_(padded_batches=padded), backend="cpu")
                d[padded] = (m.peak_bytes, a.device_saved_bytes + a.recompute_bytes)
            dm, dp = d[True][0] - d[False][0], d[True][1] - d[False][1]
            bad += dm != dp
            print(f"{fam:14} {mode:11} step peak padded - unpadded: measured {dm:+,d}, ftplan {dp:+,d}"
                  f"{'' if dm == dp else '  DIFFERS'}", flush=True)
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated families (default: every tiny config)")
    ap.add_argument("--eager", action="store_true", help="eager attention too (the families with that path)")
    ap.add_argument("--recompute", action="store_true", help="the recompute peak (llama, qwen2, gemma3_text)")
    a = ap.parse_args()
    families = a.only.split(",") if a.only else sorted(TINY_CONFIGS)
    bad = 0
    for fam in families:
        attns = ["eager"] if fam in EAGER_ONLY else (["sdpa", "eager"] if a.eager and fam in EAGER else ["sdpa"])
        for attn in attns:
            for method in ("full", "lora"):
                for ckpt in (False, True):
                    m0, p0 = measure(fam, method, ckpt, attn, False)
                    m1, p1 = measure(fam, method, ckpt, attn, True)
                    ok = m0 == p0 and m1 == p1
                    bad += not ok
                    print(f"{fam:14} {attn:5} {method:4} gc={int(ckpt)}  padded {m1:>9,d} B (ftplan {p1:>9,d}), "
                          f"padding adds {m1 - m0:+,d} B (ftplan {p1 - p0:+,d}){'' if ok else '  DIFFERS'}", flush=True)
    if a.recompute:
        bad += recompute_cases([f for f in ("llama", "qwen2", "gemma3_text") if not a.only or f in families])
    print(f"{bad} case(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
