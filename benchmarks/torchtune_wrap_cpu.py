"""torchtune's own FSDP2 wrapping (``Layout.fsdp_wrap="torchtune"``) against real 2-rank gloo runs.

    PYTHONPATH=src python benchmarks/torchtune_wrap_cpu.py [--write]      (about 1 min on 2 cores)

``--write`` records the measured bytes in ``benchmarks/measurements/torchtune_wrap_cpu.json``, which
``tests/test_torchtune_wrapping.py`` holds the formula to without torch (one case is re-measured in CI).

torchtune 0.3.1 (the recipes behind the README's memory table) shards with its own ``fully_shard``
calls (``training.shard_model``): every decoder layer, in full fine-tuning also the input embedding
and the output projection (``custom_sharded_layers: ['tok_embeddings', 'output']``), then the whole
model, whose root unit keeps the rest gathered from the start of forward to the end of backward
(LoRA: embedding, final norm, output; full: the final norm). Pure bf16 (no mixed-precision policy),
the output projection called once per chunk of ``CEWithChunkedOutputLoss`` (8 chunks), optionally
``CPUOffloadPolicy``. ``ftplan.measure.distributed`` runs that wrapping on a tiny Hugging Face llama
(``Case(fsdp_wrap="torchtune")``: ``_wrap_torchtune``; torchtune's model code is its own
``TransformerDecoder``, an HF ``LlamaForCausalLM`` here, wrapped in the same unit structure and
called the same way) and counts every byte per rank; ``ftplan.sharding.layout_memory`` (CPU form)
must give, byte for byte on every rank: the parameter shards, the gradient shards alive when
backward ends, the AdamW states, the host bytes under offload, and FSDP2's transient peak (gathered
units, per-chunk re-gathers of the output unit, unsharded gradients, reduce-scatter buffers).

What the runs show (torch 2.13): the output unit is gathered and resharded once per chunk in the
forward and gathered again per chunk in backward; each chunk's post-backward reshards it with no
gradient to reduce: autograd sums the chunks' weight gradients in its input buffer (the earlier
sum, the chunk's fresh gradient and their out-of-place sum: what ``memory._torchtune_loss_bytes``
plans, here checked too) and the sum reaches the parameter, and FSDP's one reduce-scatter, after
the last chunk. The root's norm gradient (full) is reduced in the final callback, just before the
embedding unit's. The activations are not compared (this harness does not checkpoint; the
saved tensors of torchtune's tail are held by ``tests/test_torchtune_loss.py``).

Differences held: none, on a quiet machine. On a loaded one gloo may still reference the last
reduce-scatter's input (one unit's bf16 gradient) when backward ends on one rank, as in
``tests/test_distributed_memory.py`` (``BOUNDS["last_reduce_input"]``); those cases are re-run.
"""

from __future__ import annotations

import dataclasses
import sys
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ftplan.measure.distributed import Case  # noqa: E402

_QKV = "q_proj,k_proj,v_proj"
#: the grid: full / LoRA (torchtune's 70B_lora q/k/v targets), CPU offload, reshard after forward
#: off, 8 chunks (seq 24, 40, 48), uneven chunks (seq 20: 7 chunks of 3 and 2 positions), one row
#: (full: batch x seq_len != hidden_size, see ``measure.distributed``'s partial sums)
CASES = [
    Case(family="llama", engine="fsdp2", method="full", fsdp_wrap="torchtune", seq_len=24, offload_params=True),
    Case(family="llama", engine="fsdp2", method="full", fsdp_wrap="torchtune", seq_len=40),
    Case(family="llama", engine="fsdp2", method="full", fsdp_wrap="torchtune", seq_len=20),
    Case(family="llama", engine="fsdp2", method="full", fsdp_wrap="torchtune", seq_len=48, batch=1,
         reshard_after_forward=False),
    Case(family="llama", engine="fsdp2", method="lora", fsdp_wrap="torchtune", seq_len=32, lora_targets=_QKV),
    Case(family="llama", engine="fsdp2", method="lora", fsdp_wrap="torchtune", seq_len=32, lora_targets=_QKV,
         offload_params=True),
    Case(family="llama", engine="fsdp2", method="lora", fsdp_wrap="torchtune", seq_len=20, batch=1,
         lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"),
]
#: the representative case CI runs (tests/test_torchtune_wrapping.py): the 70B full row's recipe
CI_CASE = CASES[0]


def predicted(case: Case, world: int = 2) -> dict[str, Fraction]:
    """ftplan's per-rank bytes for ``case`` (``layout_memory``, CPU form, torch 2.13 schedule)."""
    import torch

    from ftplan.catalog.constants import memory_constants
    from ftplan.measure import torchref as TR
    from ftplan.memory import model_states
    from ftplan.model import model_from_config
    from ftplan.sharding import layout_memory

    consts = dataclasses.replace(memory_constants(), fsdp2_schedule_torch=float(
        ".".join(torch.__version__.split("+")[0].split(".")[:2])))
    spec = model_from_config(TR.TINY_CONFIGS[case.family])
    job, layout = case.job(), case.layout(world)
    lm = layout_memory(spec, job, layout, model_states(spec, job), consts, "cpu")
    return {"params": lm.frozen_weights + lm.trainable_weights, "grads": lm.gradients,
            "optimizer": lm.optimizer_states, "host": lm.host,
            # (the layout splits the engine's forward and backward peaks under torchtune's wrapping)
            "transient": max(lm.transient, lm.forward_transient or 0)}


def head_weight_bytes(case: Case) -> int:
    from ftplan.measure import torchref as TR

    cfg = TR.TINY_CONFIGS[case.family]
    return cfg["vocab_size"] * cfg["hidden_size"] * 2


def gloo_slack(case: Case, world: int = 2) -> dict[str, int]:
    """Bytes a rank may hold above the formula, by gloo's timing on a loaded machine (as
    ``tests/test_distributed_memory.py``'s ``BOUNDS``): the transient, a staging copy of a
    reduce-scatter outliving it (at most the largest unit's shard); the gradients (the host under
    offload), the last unit's reduce-scatter input still referenced by gloo's work when backward
    ends (at most the largest unit's padded gradient)."""
    from ftplan.measure import torchref as TR
    from ftplan.model import model_from_config
    from ftplan.sharding import fsdp_units

    spec = model_from_config(TR.TINY_CONFIGS[case.family])
    units = fsdp_units(spec, case.job(), "fsdp2", wrap="torchtune")
    # (no mixed precision: every tensor gathered and reduced in its own dtype)
    largest = max(sum(t.padded(world) * t.nbytes for t in u.tensors) for u in units)
    last = max(sum(t.padded(world) * t.nbytes for t in u.tensors if t.trainable) for u in units)
    return {"transient": largest // world, "grads": last, "host": last}


def check(case: Case, ranks, world: int = 2) -> list[str]:
    """Differences between the measured ranks and ftplan (empty: every byte holds, but for the
    timing slack of ``gloo_slack``, which is reported in ``detail`` when used)."""
    p = predicted(case, world)
    slack = gloo_slack(case, world)
    bad = []
    for m in ranks:
        measured = {"params": m.params, "grads": m.grads, "optimizer": m.optimizer, "host": m.host,
                    "transient": m.engine_transient_peak}
        if case.offload_params:
            # on CPU the host and the "device" are one memory: every offloaded byte is measured
            # where the engine keeps it, all of it host bytes; the device holds no model state
            measured.update(params=0, grads=0, optimizer=0)
        for k, v in measured.items():
            if not 0 <= v - p[k] <= slack.get(k, 0):
                bad.append(f"{case.label} rank {m.rank}: {k} measured {v}, predicted {float(p[k]):.0f}")
            elif v != p[k]:
                m.detail.setdefault("gloo_slack_used", {})[k] = int(v - p[k])
        # the engine's own leftovers: the device mesh's scalars (the loop's ids and labels aside)
        rest = m.engine_persistent - sum(v for k, v in m.detail.get("persistent_by_owner", {}).items()
                                         if k in ("init:model", "fwd0:other"))
        if not 0 <= rest <= 16:
            bad.append(f"{case.label} rank {m.rank}: engine persistent {rest} B")
    return bad


RECORDS = ROOT / "benchmarks" / "measurements" / "torchtune_wrap_cpu.json"
_FIELDS = ("params", "grads", "optimizer", "host", "engine_transient_peak")


def record(case: Case) -> dict:
    """The fields that name a case in the records."""
    return {"family": case.family, "method": case.method, "batch": case.batch, "seq_len": case.seq_len,
            "offload_params": case.offload_params, "reshard_after_forward": case.reshard_after_forward,
            "lora_targets": case.lora_targets}


def case_of(rec: dict) -> Case:
    return Case(engine="fsdp2", fsdp_wrap="torchtune", **{k: rec[k] for k in record(CI_CASE)})


def main(argv: list[str] | None = None) -> int:
    import json

    import torch

    from ftplan.measure.distributed import run_cases

    write = "--write" in (argv if argv is not None else sys.argv[1:])
    results = run_cases(CASES, 2, timeout_s=600)
    failed = []
    recs = []
    for case, res in zip(CASES, results):
        if isinstance(res, str):
            print(f"{case.label}: FAILED\n{res}")
            failed.append(case)
            continue
        p = predicted(case)
        bad = check(case, res)
        used = [m.detail.get("gloo_slack_used") for m in res if m.detail.get("gloo_slack_used")]
        print(f"{case.label} (b={case.batch}, s={case.seq_len}): " + ", ".join(
            f"{k} {float(v):,.0f}" for k, v in p.items())
            + (" -- every rank equal" if not bad and not used else f" -- within gloo's timing slack {used}"
               if not bad else ""))
        for line in bad:
            print("  " + line)
        if bad:
            failed.append(case)
        recs.append({**record(case), "ranks": [{k: getattr(m, k) for k in _FIELDS} for m in res]})
    if write and not failed:
        RECORDS.write_text(json.dumps({
            "what": "per-rank bytes of torchtune's FSDP2 wrapping on a tiny HF llama, 2 gloo ranks "
                    "(benchmarks/torchtune_wrap_cpu.py; offload: every model state is host memory on CPU)",
            "torch": torch.__version__, "records": recs}, indent=1) + "\n")
        print(f"wrote {RECORDS.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
