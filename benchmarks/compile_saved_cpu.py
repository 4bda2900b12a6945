"""torch.compile's saved activations on CPU, by hand: ftplan's rule against aot_eager and inductor.

    python benchmarks/compile_saved_cpu.py [--inductor] [--whole-model] [--only FAMILY]

Each case builds a tiny real Hugging Face model (``ftplan.measure.configs.TINY_CONFIGS``), compiles
each decoder layer (``ftplan.measure.compileref.compiled_saved``), counts the bytes one forward
saves for backward and compares them with ftplan's (``activation_parts`` with ``torch_compile=True``)
(autocast's weight copies taken out, as ftplan counts them with the weights). ``--inductor`` also
compiles each case with inductor (tens of seconds a case on 2 cores) and checks that it saves the
same bytes as aot_eager (both partition with ``min_cut_rematerialization_partition``), which the
CI test (``tests/test_compile_memory.py``) relies on. ``--whole-model`` also compiles the whole
model at once (HF Trainer's ``torch_compile=True``) and prints what that changes. Prints one line
a case; exits 1 if a modelled case differs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ftplan.job import Job, LoraSpec  # noqa: E402
from ftplan.measure.compileref import compiled_saved  # noqa: E402
from ftplan.measure.configs import TINY_CONFIGS  # noqa: E402
from ftplan.memory import _act_dtypes, _compiled_layer_reason, activation_parts  # noqa: E402
from ftplan.model import model_from_config  # noqa: E402

#: (family, method, precision, LoRA dropout, checkpointing[, adapter dtype[, the layers compiled]])
CASES: list[tuple] = [
    ("llama", "full", "bf16-mixed", 0.0, False),
    ("llama", "full", "bf16", 0.0, False),
    ("llama", "full", "bf16-mixed", 0.0, True),
    ("llama", "lora", "bf16-mixed", 0.0, False),
    ("llama", "lora", "bf16-mixed", 0.05, False),
    ("llama", "lora", "bf16-mixed", 0.05, True),
    ("qwen2", "full", "bf16-mixed", 0.0, False),
    ("qwen2", "lora", "bf16-mixed", 0.0, False),
    ("qwen2", "lora", "bf16-mixed", 0.05, False),
    ("qwen3", "full", "bf16-mixed", 0.0, False),
    ("qwen3", "full", "bf16", 0.0, False),
    ("qwen3", "lora", "bf16-mixed", 0.0, False),
    ("qwen3", "lora", "bf16-mixed", 0.05, False),
    # bf16 adapters on the bf16 base under autocast: LoRA as FSDP runs it (accelerate's autocast
    # around param_dtype copies), planned with engine_compute="autocast"
    ("llama", "lora", "bf16-mixed", 0.0, False, "bf16"),
    ("qwen3", "lora", "bf16-mixed", 0.05, False, "bf16"),
    # smollm3's NoPE layer; only the modelled layers compiled where the others are planned eager:
    # qwen3_moe's dense layer 0, lfm2's attention layer 1
    ("smollm3", "full", "bf16-mixed", 0.0, False),
    ("smollm3", "lora", "bf16-mixed", 0.05, False),
    ("qwen3_moe", "full", "bf16-mixed", 0.0, False, "fp32", (0,)),
    ("lfm2", "full", "bf16-mixed", 0.0, False, "fp32", (1,)),
    ("lfm2", "lora", "bf16-mixed", 0.05, False, "fp32", (1,)),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inductor", action="store_true")
    ap.add_argument("--whole-model", action="store_true")
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    bad = 0
    for fam, method, prec, drop, ckpt, *extra in CASES:
        if args.only and fam != args.only:
            continue
        adapter = extra[0] if extra else "fp32"
        only = extra[1] if len(extra) > 1 else None
        spec = model_from_config(TINY_CONFIGS[fam])
        job = Job(method=method, precision=prec, micro_batch=2, seq_len=24, gradient_checkpointing=ckpt,
                  attn_impl="sdpa", lora=LoraSpec(r=8, alpha=16, dropout=drop), loss="hf", torch_compile=True)
        engine = ""
        if adapter == "bf16":
            job, engine = job.with_(precision="bf16"), "autocast"
        reasons = {_compiled_layer_reason(g, spec, job, _act_dtypes(job, "cpu", engine)) for g in spec.groups}
        reason = "" if "" in reasons else "; ".join(sorted(reasons))

        def planned(j):
            p = activation_parts(spec, j, backend="cpu", engine_compute=engine)
            return p.device_saved_bytes + p.loss_saved_bytes

        pred, eager = planned(job), planned(job.with_(torch_compile=False))
        t0 = time.perf_counter()
        r = compiled_saved(TINY_CONFIGS[fam], method=method, precision=prec, dropout=drop, gradient_checkpointing=ckpt,
                           adapter_dtype=adapter, only_layers=only)
        got = r.saved_bytes - r.weight_copy_bytes
        line = (f"{fam:6s} {method:4s} {prec:10s} {adapter + ' adapters ' if method == 'lora' else ''}dropout {drop:<4} ckpt {ckpt!s:5s}  aot_eager {got:7d}  "
                f"ftplan {pred:7d} ({'=' if got == pred else 'DIFF'})  eager-rule {eager:7d}  "
                f"copies {r.weight_copy_bytes:6d}  {time.perf_counter() - t0:5.1f}s")
        if reason:
            line += f"  [not modelled: {reason}]"
        elif got != pred:
            bad += 1
        if args.inductor:
            t0 = time.perf_counter()
            ri = compiled_saved(TINY_CONFIGS[fam], method=method, precision=prec, dropout=drop,
                                gradient_checkpointing=ckpt, backend="inductor", adapter_dtype=adapter,
                                only_layers=only)
            same = (ri.saved_bytes, ri.weight_copy_bytes) == (r.saved_bytes, r.weight_copy_bytes)
            bad += not same
            line += (f"  inductor {ri.saved_bytes - ri.weight_copy_bytes:7d} copies {ri.weight_copy_bytes:6d} "
                     f"({'same' if same else 'DIFFERENT'}, {time.perf_counter() - t0:5.1f}s)")
        if args.whole_model:
            rw = compiled_saved(TINY_CONFIGS[fam], method=method, precision=prec, dropout=drop,
                                gradient_checkpointing=ckpt, whole_model=True, adapter_dtype=adapter)
            line += f"  whole-model {rw.saved_bytes - rw.weight_copy_bytes:7d} copies {rw.weight_copy_bytes:6d}"
        print(line, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
