"""Peer comparison: ftplan vs other memory estimators over the measurement records.

    python benchmarks/accuracy.py [RECORDS.jsonl ...]   (default: benchmarks/measurements/*.jsonl)

Two tables, errors signed ``(estimate - measured) / measured`` in percent, statistics over |error|:

1. **GPU peak** (records with ``run.device == "cuda"``, not tiny): each tool's per-GPU memory
   estimate vs the measured ``torch.cuda.max_memory_reserved`` (what the allocator held: the part of
   the GPU a job needs that PyTorch sees). A *false fit* is an OOM record whose estimate fits the
   GPU (``env.gpu_total_bytes``). This is the accuracy that counts, and it needs GPU records.
2. **Model states** (every ``ok`` record with exact tensor accounting, ``measured.tensors``: the
   CPU records that exist today, and GPU ones later): parameter + gradient + optimizer-state bytes
   + autocast's low-precision weight copies, exactly as ``ftplan validate`` measures them, vs each
   tool's model-state figure. No allocator, no activations: it checks the static part only.

Tools and the figure taken from each (peak table / model-states table):

* ftplan: ``estimate_memory(...)``: ``peak_reserved_bytes`` (fit judged on ``device_total_bytes``)
  / ``model_states_bytes``.
* accelerate: ``accelerate estimate-memory`` logic. Full fine-tuning: the "Training using Adam"
  column, ``max(accelerate.commands.estimate.estimate_training_usage(fp32 bytes, dtype).values())``
  when importable, else 4 x fp32 bytes. LoRA/QLoRA: it has no adapter estimate, so a user reads the
  model size row in bf16 (LoRA) or int4 (QLoRA). The same number in both tables.
* deepspeed-zero2 / deepspeed-zero3: the GPU figure of DeepSpeed's model-state estimators
  ``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs`` and
  ``deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs`` for the record's layout
  (single GPU, no offload: model states only), called from the installed deepspeed when importable,
  else a reimplementation of DeepSpeed 0.19's formulas (the output says which). P = all parameters
  (``..._all_live(model)`` counts ``model.parameters()``, frozen ones too: no adapter notion).
  The same number in both tables.
* llm-analysis: ``llm_analysis.analysis.LLMAnalysis(...).training(...)`` with a ``ModelConfig``
  built from ftplan's ``ModelSpec`` (gated MLPs as llm-analysis' iso-parameter width
  ``ffn_embed_dim = 1.5 x intermediate``), a bundled ``GPUConfig`` whose capacity is raised so that
  it reports the estimate instead of asserting that the batch does not fit (the fit is judged here
  against the record's GPU, like the other tools), ``w16a16e16`` (``w4a16e16`` for QLoRA), the
  job's micro batch / sequence / gradient accumulation / full activation recomputation, and the
  optimizer's state bytes. Peak table: ``(weight+op_state+grad+act)_memory_per_gpu``; model-states
  table: ``(weight+op_state+grad)_memory_per_gpu``. It has no adapter option: LoRA/QLoRA are
  estimated as training every weight. If it fails to import or on a record, that record is listed
  as unavailable with the reason.

Works with zero GPU records (it says so).

3. **Published multi-GPU** (``benchmarks/reference/multi_gpu_memory.csv``, see
   ``benchmarks/published_multi_gpu.py``): ftplan's per-GPU figure vs published peak memory of
   FSDP / ZeRO-3 / QLoRA-over-FSDP runs of 7B-405B models, with the signed error per row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from ftplan.measure.records import job_from_dict, layout_from_dict, load_records  # noqa: E402
from ftplan.measure.validate import stats  # noqa: E402
from ftplan.memory import estimate_memory  # noqa: E402
from ftplan.model import model_from_config  # noqa: E402

GIB = 1024**3


class Unavailable(Exception):
    """A tool cannot estimate this record (the message says why, on one line)."""


@contextlib.contextmanager
def _quiet():
    """Silence a peer's import/run chatter: stdout, stderr, warnings and logging below ERROR+."""
    prev = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(prev)


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split()) or "(no message)"
    return f"{type(e).__name__}: {msg[:160]}"


def _largest_layer_params(spec) -> int:
    from ftplan.memory import largest_layer_params

    h = spec.hidden_size
    best = largest_layer_params(spec)
    return max(best, spec.vocab_size * h)  # the embedding is often the largest module


# ---------------------------------------------------------------------------------------------
# tools: each returns (peak estimate, bytes the fit is judged on, model-state estimate)
# ---------------------------------------------------------------------------------------------
def est_ftplan(spec, job, layout, rec):
    m = estimate_memory(spec, job, layout)
    return m.peak_reserved_bytes, m.device_total_bytes, m.model_states_bytes


def est_accelerate(spec, job, layout, rec):
    fp32 = 4 * spec.params.total
    if job.method == "full":
        try:
            from accelerate.commands.estimate import estimate_training_usage

            dtype = "float32" if job.precision == "fp32" else ("bfloat16" if "bf16" in job.precision else "float16")
            sizes = estimate_training_usage(fp32, dtype)
            v = max(sizes.values())
            if v > 0:
                return v, v, v
        except ImportError:
            pass
        return 4 * fp32, 4 * fp32, 4 * fp32
    v = fp32 // 2 if job.method == "lora" else fp32 // 8
    return v, v, v


# ---- DeepSpeed ------------------------------------------------------------------------------
def _ds_zero2_reimpl(total_params, num_gpus_per_node=1, num_nodes=1, cpu_offload=True,
                     additional_buffer_factor=1.5):
    """deepspeed/runtime/zero/stage_1_and_2.py (0.19): (cpu_mem, gpu_mem). Releases before
    ~0.9 used ``4 P + 16 P / gpus`` for the GPU without offload: the same on one GPU."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def _ds_zero3_reimpl(total_params, largest_layer_params, num_gpus_per_node=1, num_nodes=1,
                     cpu_offload=True, cpu_offload_params=True, zero_init=True,
                     additional_buffer_factor=1.5):
    """deepspeed/runtime/zero/stage3.py (0.19): (cpu_mem, gpu_mem, largest_layer_memory)."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            f = 18 * gpus_factor if zero_init else max(4 * num_gpus_per_node, 18 * gpus_factor)
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            f = 16 * gpus_factor if zero_init else max(4 * num_gpus_per_node, 16 * gpus_factor)
        cpu_mem = total_params * f * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        cpu_mem = (largest_layer_params if zero_init else total_params) * 4 * num_gpus_per_node \
            * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


_DS: dict = {}


def _deepspeed():
    """(zero2 fn, zero3 fn, description): the installed DeepSpeed's, else the reimplementation."""
    if not _DS:
        try:
            with _quiet():
                import deepspeed
                from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3
                from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as z2
            _DS.update(z2=z2, z3=z3, what=f"installed deepspeed {getattr(deepspeed, '__version__', '?')} "
                                          "(deepspeed.runtime.zero.*.estimate_zero{2,3}_model_states_mem_needs)")
        except Exception as e:  # ImportError, or a dependency of it failing
            _DS.update(z2=_ds_zero2_reimpl, z3=_ds_zero3_reimpl,
                       what=f"reimplementation of DeepSpeed 0.19's formulas (deepspeed not importable: {_one_line(e)})")
    return _DS["z2"], _DS["z3"], _DS["what"]


def est_zero2(spec, job, layout, rec):
    z2, _, _ = _deepspeed()
    with _quiet():
        _, gpu = z2(spec.params.total, num_gpus_per_node=layout.gpus_per_node, num_nodes=layout.nodes,
                    cpu_offload=layout.offload_optimizer, additional_buffer_factor=1.5)
    return gpu, gpu, gpu


def est_zero3(spec, job, layout, rec):
    _, z3, _ = _deepspeed()
    with _quiet():
        out = z3(spec.params.total, _largest_layer_params(spec), num_gpus_per_node=layout.gpus_per_node,
                 num_nodes=layout.nodes, cpu_offload=layout.offload_optimizer,
                 cpu_offload_params=layout.offload_params, zero_init=True, additional_buffer_factor=1.5)
    gpu = out[1]
    return gpu, gpu, gpu


# ---- llm-analysis ---------------------------------------------------------------------------
_LA: dict = {}


def _llm_analysis():
    """(modules dict or None, status line)."""
    if not _LA:
        try:
            with _quiet():
                from llm_analysis import analysis, config
                from llm_analysis.logger import logger as la_logger
            la_logger.setLevel(logging.CRITICAL + 1)  # its own logger, with its own stderr handler
            la_logger.disabled = True
            try:
                from importlib.metadata import version

                ver = version("llm-analysis")
            except Exception:
                ver = "?"
            _LA.update(mods={"analysis": analysis, "config": config},
                       what=f"installed llm-analysis {ver} (LLMAnalysis(...).training(...))")
        except Exception as e:  # ImportError, or a missing/incompatible dependency of it
            _LA.update(mods=None, what=f"unavailable ({_one_line(e)})")
    return _LA["mods"], _LA["what"]


def _la_gpu_name(gpu_name: str | None, available) -> str:
    n = (gpu_name or "").lower()
    for key, cfg in (("h100", "h100-sxm-80gb"), ("h200", "h100-sxm-80gb"), ("a100", "a100-sxm-80gb"),
                     ("a10g", "a10g-pcie-24gb"), ("a6000", "a6000-48gb"), ("v100", "v100-sxm-32gb")):
        if key in n and cfg in available:
            return cfg
    return "a100-sxm-80gb"  # CPU records / unknown GPUs: only the memory terms are compared


_LA_OPTIMIZER_STATE_BYTES = {  # bytes of optimizer state per parameter besides the master weights
    "adamw": 8, "adamw_8bit": 2, "paged_adamw_8bit": 2, "sgd": 4,
}


def est_llm_analysis(spec, job, layout, rec):
    mods, why = _llm_analysis()
    if mods is None:
        raise Unavailable(why)
    an, cfg = mods["analysis"], mods["config"]
    g0 = spec.groups[0]
    a = g0.attention
    if g0.moe is not None:
        inter, experts, top_k = g0.moe.expert_intermediate_size, g0.moe.num_experts, g0.moe.top_k
    elif g0.mlp is not None:
        inter, experts, top_k = g0.mlp.intermediate_size, 1, 1
    else:
        raise Unavailable("no MLP in the first layer group")
    ffn = 3 * inter / 2  # gated MLP (3 matrices) as llm-analysis' 2-matrix iso-parameter width
    if job.optimizer not in _LA_OPTIMIZER_STATE_BYTES:
        raise Unavailable(f"no optimizer-state model for {job.optimizer!r}")
    other = _LA_OPTIMIZER_STATE_BYTES[job.optimizer]
    if job.precision in ("bf16", "fp16"):  # pure half precision: 16-bit master and states
        master, other = 2, other // 2 if job.optimizer in ("adamw", "sgd") else other
    else:
        master = 4
    if job.precision == "fp32":
        dtype = cfg.DtypeConfig(name="w32a32e32", weight_bits=32, activation_bits=32, embedding_bits=32)
    elif job.method == "qlora":
        dtype = cfg.get_dtype_config_by_name("w4a16e16")
    else:
        dtype = cfg.get_dtype_config_by_name("w16a16e16")
    gpu = cfg.get_gpu_config_by_name(_la_gpu_name((rec.get("env") or {}).get("gpu_name"), cfg.gpu_configs))
    gpu = dataclasses.replace(gpu, mem_per_GPU_in_GB=1e9)  # report, never assert "does not fit"
    zero = {"zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}.get(layout.strategy, 0)
    try:
        with _quiet():
            model = cfg.ModelConfig(
                name=spec.name, num_layers=spec.num_layers, n_head=a.num_heads, hidden_dim=spec.hidden_size,
                vocab_size=spec.vocab_size,
                max_seq_len=max(spec.max_position_embeddings or 0, job.seq_len),
                num_key_value_heads=a.num_kv_heads, ffn_embed_dim=ffn, expansion_ratio=ffn / spec.hidden_size,
                model_type=spec.family, moe_num_experts=experts, moe_top_k=top_k)
            par = cfg.ParallelismConfig(tp_size=layout.tp, pp_size=layout.pp, dp_size=layout.dp)
            la = an.LLMAnalysis(model, gpu, dtype, par)
            s = la.training(
                batch_size_per_gpu=job.micro_batch, gradient_accumulation_steps=job.grad_accum,
                seq_len=job.seq_len,
                activation_recomputation=(an.ActivationRecomputation.FULL if job.gradient_checkpointing
                                          else an.ActivationRecomputation.NONE),
                ds_zero=an.DSZeRO(zero), master_weights_dtype_bytes=master, other_op_bytes=other,
                flash_attn=job.attn_impl != "eager", mlp_gated_linear_units=True)
    except Exception as e:  # AssertionError and friends from inside llm-analysis
        raise Unavailable(_one_line(e)) from None
    total = int(s["(weight+op_state+grad+act)_memory_per_gpu"])
    return total, total, int(s["(weight+op_state+grad)_memory_per_gpu"])


TOOLS = {
    "ftplan": est_ftplan,
    "accelerate": est_accelerate,
    "deepspeed-zero2": est_zero2,
    "deepspeed-zero3": est_zero3,
    "llm-analysis": est_llm_analysis,
}


# ---------------------------------------------------------------------------------------------
# measured figures
# ---------------------------------------------------------------------------------------------
def measured_model_states(rec) -> int | None:
    """param + grad + optimizer-state bytes + autocast weight copies (as ``ftplan validate``)."""
    if rec.get("outcome") != "ok":
        return None
    t = (rec.get("measured") or {}).get("tensors") or {}
    if any(t.get(k) is None for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes")):
        return None
    return t["param_bytes"] + t["grad_bytes"] + t["optimizer_state_bytes"] + (t.get("saved_weight_copy_bytes") or 0)


def _f(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _estimate_all(records):
    """{tool: [(rec, (peak, fit, states) or None, reason or None)]}"""
    out = {}
    for tool, fn in TOOLS.items():
        rows = []
        for r in records:
            try:
                spec = model_from_config(r["model"]["config"], name=r["model"].get("name"))
                job = job_from_dict(r["job"])
                layout = layout_from_dict(r.get("layout"))
                rows.append((r, fn(spec, job, layout, r), None))
            except Unavailable as e:
                rows.append((r, None, str(e)))
            except Exception as e:  # a peer (or a record) we cannot handle: never crash the table
                rows.append((r, None, _one_line(e)))
        out[tool] = rows
    return out


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted((ROOT / "benchmarks" / "measurements").glob("*.jsonl"))
    records, problems = load_records(paths, strict_files=False)
    for p in problems:
        print(f"warning: {p}", file=sys.stderr)
    gpu = [r for r in records if (r.get("run") or {}).get("device") == "cuda" and not r["run"].get("tiny")]
    ms = [r for r in records if measured_model_states(r) is not None]
    est = _estimate_all(records)
    ids = {id(r) for r in gpu}
    ms_ids = {id(r) for r in ms}
    unavailable: dict[str, dict[str, int]] = {}

    _, _, ds_what = _deepspeed()
    _, la_what = _llm_analysis()
    print(f"{len(records)} record(s): {len(gpu)} on GPU (full-size models), "
          f"{len(ms)} with exact tensor accounting (measured.tensors)")
    print(f"deepspeed-zero2/3: {ds_what}")
    print(f"llm-analysis: {la_what}")
    print("errors: (estimate - measured) / measured in %; median and max over |error|, signed median shown too")

    # ---- table 1: GPU peak ------------------------------------------------------------------
    print()
    print("Table 1 - GPU peak: per-GPU memory estimate vs measured torch.cuda.max_memory_reserved "
          "(GPU records, full-size models); false fits = OOM records the tool says fit")
    if not gpu:
        print("no GPU records yet: peak-memory accuracy cannot be assessed until GPU records exist "
              "(run benchmarks/run_campaign.sh on a GPU machine); the table below is empty")
    print(f"{'tool':16} {'n':>4} {'median |err| %':>15} {'median err %':>13} {'max |err| %':>12} {'false fits':>11}")
    for tool, rows in est.items():
        errs, false_fits, n_oom = [], 0, 0
        for r, e, why in rows:
            if id(r) not in ids:
                continue
            if e is None:
                unavailable.setdefault(tool, {}).setdefault(why, 0)
                unavailable[tool][why] += 1
                continue
            peak, fit_bytes, _ = e
            total = (r.get("env") or {}).get("gpu_total_bytes")
            if r["outcome"] == "oom":
                n_oom += 1
                if total and fit_bytes <= total:
                    false_fits += 1
            elif r["outcome"] == "ok":
                meas = r["measured"].get("peak_reserved_bytes")
                if meas:
                    errs.append((peak - meas) / meas * 100)
        s = stats(errs)
        sgn = statistics.median(errs) if errs else None
        print(f"{tool:16} {s['n']:>4} {_f(s['median_pct']):>15} {_f(sgn):>13} {_f(s['max_pct']):>12} "
              f"{f'{false_fits}/{n_oom}':>11}")

    # ---- table 2: model states --------------------------------------------------------------
    print()
    print("Table 2 - model states: estimate vs measured parameter + gradient + optimizer-state bytes "
          "+ autocast weight copies (measured.tensors, as `ftplan validate`; no activations, no allocator)")
    print("  ftplan: model_states_bytes | accelerate: its 'Training using Adam' figure (full) or model size "
          "(LoRA bf16 / QLoRA int4) | deepspeed-zero2/3: estimator's GPU figure, 1 GPU, no offload, "
          "P = all params | llm-analysis: (weight+op_state+grad)_memory_per_gpu, all weights trainable")
    by_method: dict[str, dict[str, list[float]]] = {}
    print(f"{'tool':16} {'n':>4} {'median |err| %':>15} {'median err %':>13} {'max |err| %':>12}")
    for tool, rows in est.items():
        errs = []
        for r, e, why in rows:
            if id(r) not in ms_ids:
                continue
            if e is None:
                if id(r) not in ids:  # GPU records were counted above
                    unavailable.setdefault(tool, {}).setdefault(why, 0)
                    unavailable[tool][why] += 1
                continue
            meas = measured_model_states(r)
            err = (e[2] - meas) / meas * 100
            errs.append(err)
            by_method.setdefault(tool, {}).setdefault(r["job"].get("method", "?"), []).append(err)
        s = stats(errs)
        sgn = statistics.median(errs) if errs else None
        print(f"{tool:16} {s['n']:>4} {_f(s['median_pct']):>15} {_f(sgn):>13} {_f(s['max_pct']):>12}")
    if by_method:
        methods = sorted({m for d in by_method.values() for m in d})
        print()
        print("model states by method: median |err| % (n)")
        print(f"{'tool':16} " + " ".join(f"{m:>12}" for m in methods))
        for tool, d in by_method.items():
            cells = [f"{_f(stats(d[m])['median_pct'])} ({len(d[m])})" if m in d else "-" for m in methods]
            print(f"{tool:16} " + " ".join(f"{c:>12}" for c in cells))
    if not ms:
        print("no records with measured.tensors: the table above is empty")
    kinds = {("cpu" if (r.get("run") or {}).get("device") != "cuda" else "gpu")
             + (" tiny" if (r.get("run") or {}).get("tiny") else "") for r in ms}
    print(f"note: table 2 covers {', '.join(sorted(kinds)) or 'no'} records and checks model states only; "
          "peak-memory accuracy (table 1) needs GPU records" + (" (none exist yet)" if not gpu else ""))

    for tool, reasons in unavailable.items():
        for why, n in reasons.items():
            print(f"unavailable: {tool}: {n} record(s): {why}")

    # ---- table 3: published multi-GPU measurements ------------------------------------------
    print()
    from published_multi_gpu import print_table  # benchmarks/published_multi_gpu.py

    print_table()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
