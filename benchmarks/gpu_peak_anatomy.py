"""What is alive at a CUDA training step's peak: one ``ftplan measure`` run per matrix row with
PyTorch's allocator history on, replayed to the moment of the highest allocated bytes.

    python benchmarks/gpu_peak_anatomy.py MATRIX.yaml OUT.json [--steps 3]

For each row: the measured peak, and the blocks alive at that moment grouped by where they were
allocated (the innermost Python frame in transformers / peft / bitsandbytes / trl / torch.optim /
ftplan, or the line that called ``backward()`` for what autograd allocated), largest groups first.
It also gives how many events after the peak's moment the step's last ``backward()`` allocation
and the first optimizer allocation come, so the peak's phase can be read off.

Runs on a CUDA machine only (the device tool); the output is data for the repo
(``benchmarks/measurements/<gpu>-peak-anatomy.json``), read by the memory model's authors, not by tests.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

KEEP = ("transformers/", "peft/", "bitsandbytes/", "trl/", "torch/optim/", "ftplan/", "accelerate/",
        "torch/utils/checkpoint", "torch/nn/functional", "torch/nn/modules")


def _site(frames: list[dict]) -> str:
    for f in frames:  # innermost first
        name = f.get("filename", "")
        if any(k in name for k in KEEP):
            short = name.split("site-packages/")[-1].split("/src/")[-1]
            return f"{short}:{f.get('line')}:{f.get('name')}"
    return "(no python frame: C++/autograd)" if not frames else \
        f"{frames[0].get('filename', '?').split('/')[-1]}:{frames[0].get('line')}:{frames[0].get('name')}"


def _replay(trace: list[dict]) -> tuple[int, int, dict[int, tuple[int, str]]]:
    """(peak bytes, event index of the peak, live blocks there); a block counts from its ``alloc``
    to its ``free_requested`` (what ``torch.cuda.memory_allocated`` follows)."""
    def step(live: dict, ev: dict) -> int:
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], _site(ev.get("frames", [])))
            return ev["size"]
        if ev["action"] == "free_requested" and ev["addr"] in live:
            return -live.pop(ev["addr"])[0]
        return 0

    live: dict[int, tuple[int, str]] = {}
    total = peak = peak_i = 0
    for i, ev in enumerate(trace):
        total += step(live, ev)
        if total > peak:
            peak, peak_i = total, i
    live = {}
    for ev in trace[: peak_i + 1]:
        step(live, ev)
    return peak, peak_i, live


def main(argv: list[str]) -> int:
    import torch

    from ftplan.cli.measure import _row_job
    from ftplan.job import Layout
    from ftplan.measure.run import load_matrix, measure

    steps = 3
    if "--steps" in argv:
        steps = int(argv[argv.index("--steps") + 1])
    matrix, out = argv[0], Path(argv[1])
    results = json.loads(out.read_text()) if out.exists() else []
    for i, row in enumerate(load_matrix(matrix), 1):
        job = _row_job(row, f"row {i}")
        torch.cuda.empty_cache()
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
        try:
            rec = measure(str(row["model"]), job, Layout(), steps=steps, device="cuda")
            snap = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        trace = snap["device_traces"][0]
        peak, peak_i, live = _replay(trace)
        groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for size, site in live.values():
            groups[site][0] += 1
            groups[site][1] += size
        top = sorted(groups.items(), key=lambda kv: -kv[1][1])[:40]
        after = trace[peak_i + 1:]
        nxt = {}
        for j, ev in enumerate(after):
            if ev["action"] != "alloc":
                continue
            s = _site(ev.get("frames", []))
            for tag in ("torch/optim/", "backward", "checkpoint"):
                if tag in s and tag not in nxt:
                    nxt[tag] = j
        item = {
            "model": row["model"], "job": rec["job"], "outcome": rec["outcome"],
            "measured_peak_allocated_bytes": (rec.get("measured") or {}).get("peak_allocated_bytes"),
            "predicted_peak_allocated_bytes": (rec.get("predicted") or {}).get("peak_allocated_bytes"),
            "predicted_components": (rec.get("predicted") or {}).get("components"),
            "measured_tensors": (rec.get("measured") or {}).get("tensors"),
            "trace_events": len(trace), "trace_full": len(trace) >= 2_000_000,
            "replayed_peak_bytes": peak, "peak_event_index": peak_i,
            "peak_site": _site(trace[peak_i].get("frames", [])) if trace else None,
            "peak_alloc_size": trace[peak_i]["size"] if trace else None,
            "events_to_next": nxt,
            "live_at_peak": [{"site": s, "blocks": c, "bytes": b} for s, (c, b) in top],
        }
        results.append(item)
        out.write_text(json.dumps(results, indent=1))
        print(f"{row['model']} {job.method} b{job.micro_batch} s{job.seq_len} gc={job.gradient_checkpointing}: "
              f"measured {item['measured_peak_allocated_bytes']} replayed {peak} predicted "
              f"{item['predicted_peak_allocated_bytes']}; at the peak: {item['peak_site']}", flush=True)
        for g in item["live_at_peak"][:12]:
            print(f"   {g['bytes'] / 2**20:10.1f} MiB {g['blocks']:5d}  {g['site']}", flush=True)
        del snap, trace
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
