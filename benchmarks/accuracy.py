"""Peer comparison: ftplan vs other memory estimators over the measured GPU records.

    python benchmarks/accuracy.py [RECORDS.jsonl ...]   (default: benchmarks/measurements/*.jsonl)

For every GPU record (``run.device == "cuda"``, not tiny) each tool estimates the job's GPU memory;
the estimate is compared with the measured ``torch.cuda.max_memory_reserved`` (what the allocator
held: the part of the GPU a job needs that PyTorch sees). A *false fit* is an OOM record whose
estimate fits the GPU. Tools:

* ftplan: ``estimate_memory(...).peak_reserved_bytes`` (fit judged on ``device_total_bytes``).
* accelerate: ``accelerate estimate-memory`` logic. Full fine-tuning: the "Training using Adam"
  peak, ``max(accelerate.commands.estimate.estimate_training_usage(fp32 bytes, dtype).values())``
  (documented as ~4x the fp32 model size) when importable, else 4 x fp32 bytes. LoRA/QLoRA: it has
  no adapter estimate, so a user reads the model size row in bf16 (LoRA) or int4 (QLoRA).
* deepspeed-zero2 / deepspeed-zero3: DeepSpeed's model-state estimators
  ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs`` for one GPU
  without offload, reimplemented from deepspeed/runtime/zero/stage_1_and_2.py and stage3.py
  (deepspeed is not installed here): ZeRO-2 ``4 P + 16 P / gpus``, ZeRO-3
  ``4 * largest_layer + 18 P / gpus`` with P = all parameters (``..._all_live(model)`` counts
  ``model.parameters()``).
* llm-analysis: used through its Python API when importable; otherwise listed as unavailable.

Works with zero GPU records (it says so).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ftplan.measure.records import job_from_dict, layout_from_dict, load_records  # noqa: E402
from ftplan.measure.validate import stats  # noqa: E402
from ftplan.memory import estimate_memory  # noqa: E402
from ftplan.model import model_from_config  # noqa: E402

GIB = 1024**3


def _largest_layer_params(spec) -> int:
    from ftplan.memory import largest_layer_params

    h = spec.hidden_size
    best = largest_layer_params(spec)
    return max(best, spec.vocab_size * h)  # the embedding is often the largest module


def est_ftplan(spec, job, layout):
    m = estimate_memory(spec, job, layout)
    return m.peak_reserved_bytes, m.device_total_bytes


def est_accelerate(spec, job, layout):
    fp32 = 4 * spec.params.total
    if job.method == "full":
        try:
            from accelerate.commands.estimate import estimate_training_usage

            dtype = "float32" if job.precision == "fp32" else ("bfloat16" if "bf16" in job.precision else "float16")
            sizes = estimate_training_usage(fp32, dtype)
            v = max(sizes.values())
            if v > 0:
                return v, v
        except ImportError:
            pass
        return 4 * fp32, 4 * fp32
    v = fp32 // 2 if job.method == "lora" else fp32 // 8
    return v, v


def est_zero2(spec, job, layout):
    p = spec.params.total
    g = layout.world_size
    v = 4 * p + int(16 * p / g)
    return v, v


def est_zero3(spec, job, layout):
    p = spec.params.total
    g = layout.world_size
    v = 4 * _largest_layer_params(spec) + int(18 * p / g)
    return v, v


def _llm_analysis():
    try:
        import llm_analysis.analysis  # noqa: F401
    except Exception as e:  # ImportError, or a missing dependency of it
        return None, f"unavailable ({type(e).__name__}: {e})"
    return None, "importable but not wired: its API needs its own model/GPU config names"


TOOLS = {
    "ftplan": est_ftplan,
    "accelerate": est_accelerate,
    "deepspeed-zero2": est_zero2,
    "deepspeed-zero3": est_zero3,
}


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted((ROOT / "benchmarks" / "measurements").glob("*.jsonl"))
    records, problems = load_records(paths, strict_files=False)
    for p in problems:
        print(f"warning: {p}", file=sys.stderr)
    gpu = [r for r in records if (r.get("run") or {}).get("device") == "cuda" and not r["run"].get("tiny")]
    print(f"{len(records)} record(s), {len(gpu)} on GPU (full-size models)")
    if not gpu:
        print("no GPU records yet: nothing to compare (run benchmarks/run_campaign.sh on a GPU machine); "
              "the table below is empty")
    rows = []
    for tool, fn in TOOLS.items():
        errs, false_fits, n_oom = [], 0, 0
        for r in gpu:
            spec = model_from_config(r["model"]["config"], name=r["model"].get("name"))
            job = job_from_dict(r["job"])
            layout = layout_from_dict(r.get("layout"))
            est, fit_bytes = fn(spec, job, layout)
            total = (r.get("env") or {}).get("gpu_total_bytes")
            if r["outcome"] == "oom":
                n_oom += 1
                if total and fit_bytes <= total:
                    false_fits += 1
            elif r["outcome"] == "ok":
                meas = r["measured"].get("peak_reserved_bytes")
                if meas:
                    errs.append((est - meas) / meas * 100)
        s = stats(errs)
        signed = statistics.median(errs) if errs else None
        rows.append((tool, s["n"], s["median_pct"], signed, s["max_pct"], f"{false_fits}/{n_oom}"))
    _, why = _llm_analysis()
    print(f"{'tool':16} {'n':>4} {'median |err| %':>15} {'median err %':>13} {'max |err| %':>12} {'false fits':>11}")

    def f(v):
        return "-" if v is None else f"{v:.1f}"

    for tool, n, med, sgn, mx, ff in rows:
        print(f"{tool:16} {n:>4} {f(med):>15} {f(sgn):>13} {f(mx):>12} {ff:>11}")
    print(f"{'llm-analysis':16} {'-':>4} {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
